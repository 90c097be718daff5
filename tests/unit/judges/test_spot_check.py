"""Spot checks: the seeded selection of approved rows (a pure function of the seed and the id, at the
round's rate in every shard and score bucket), the round's rate, the job param and the strata a
judge job counts."""

from __future__ import annotations

from collections import Counter

import pytest

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges.reasons import reason_group
from airflow_batchinfer.judges.spot_check import (
    BUCKETS,
    NO_SCORE,
    SPOT_CHECK,
    SpotCheck,
    round_rate,
    score_bucket,
    selected,
    spot_check_reason,
)
from airflow_batchinfer.state.tally import Tally

IDS = [f"row-{i}" for i in range(40_000)]


def test_selection_is_seeded_deterministic_and_independent_of_order() -> None:
    picked = [i for i in IDS if selected(i, rate=0.05, seed="run-a")]
    assert picked == [i for i in IDS if selected(i, rate=0.05, seed="run-a")]  # the same every time
    assert sorted(i for i in reversed(IDS) if selected(i, rate=0.05, seed="run-a")) == sorted(picked)
    other = {i for i in IDS if selected(i, rate=0.05, seed="run-b")}
    assert len(other & set(picked)) < len(picked) * 0.2  # another seed, another sample
    # a higher rate keeps every row a lower one picks (the hash is compared with the rate)
    assert set(picked) <= {i for i in IDS if selected(i, rate=0.2, seed="run-a")}
    assert not any(selected(i, rate=0.0, seed="s") for i in IDS[:100])
    assert all(selected(i, rate=1.0, seed="s") for i in IDS[:100])


@pytest.mark.parametrize("rate", [0.01, 0.1, 0.5])
def test_every_shard_and_every_score_bucket_is_sampled_at_the_rate(rate: float) -> None:
    """Stratified by shard (each job samples at the same rate) and by score bucket: within each
    stratum the share picked is the rate, to within binomial noise (4 standard deviations)."""
    shards = {f"part-{k:05d}": IDS[k::8] for k in range(8)}  # 8 shards of 5,000
    for shard, ids in shards.items():
        by_bucket: Counter[str] = Counter()
        picked: Counter[str] = Counter()
        for n, rid in enumerate(ids):
            bucket = score_bucket((n * 7919 % 1000) / 1000)  # scores spread over every bucket
            by_bucket[bucket] += 1
            picked[bucket] += selected(rid, rate=rate, seed="run")
        assert set(by_bucket) == set(BUCKETS) - {NO_SCORE}
        for bucket, total in by_bucket.items():
            sd = (total * rate * (1 - rate)) ** 0.5
            assert abs(picked[bucket] - total * rate) <= 4 * sd + 1, (shard, bucket, picked[bucket], total)


def test_round_rate_holds_back_about_n_of_the_rows_the_round_plans() -> None:
    assert round_rate(50, 1_000) == 0.05
    assert round_rate(50, 30) == 1.0  # a round smaller than N: every approved row
    assert round_rate(0, 1_000) == 0.0 and round_rate(5, 0) == 0.0
    assert round_rate(1, 3) == 0.333333  # rounded: a stable job param
    # at the scale of 100M rows: as many as asked, to 6 significant digits (not 0, nor 1 in a million)
    assert round_rate(20, 100_000_000) == 2e-7 and round_rate(150, 100_000_000) == 1.5e-6
    assert round_rate(1, 30_000_000) == 3.33333e-8


@pytest.mark.parametrize(
    ("score", "bucket"),
    [(0.0, "0.0"), (0.05, "0.0"), (0.1, "0.1"), (0.55, "0.5"), (0.99, "0.9"), (1.0, "0.9"), (1.7, "0.9"),
     (-0.2, "0.0"), (None, NO_SCORE), (float("nan"), NO_SCORE), (True, NO_SCORE)],
)  # fmt: skip
def test_score_buckets(score: float | None, bucket: str) -> None:
    assert score_bucket(score) == bucket


def test_the_job_param_is_checked() -> None:
    check = SpotCheck.from_params({"rate": 0.25, "seed": "abc"})
    assert check == SpotCheck(0.25, "abc") and check.params() == {"rate": 0.25, "seed": "abc"}
    bad_ones = [
        {"rate": 0, "seed": "a"},
        {"rate": 1.5, "seed": "a"},
        {"rate": True, "seed": "a"},
        {"rate": 0.5, "seed": ""},
        {"rate": 0.5},
        {"rate": 0.5, "seed": "a", "x": 1},
        [0.5],
    ]
    for bad in bad_ones:
        with pytest.raises(ConfigError, match=r"params\.spot_check"):
            SpotCheck.from_params(bad)


def test_a_spot_checks_reason_is_one_reason_group_whatever_the_judge_said() -> None:
    assert spot_check_reason("correct: 42") == "spot check: correct: 42"
    assert spot_check_reason("") == SPOT_CHECK
    for reason in ("correct: 42", "", 'matches "Paris" exactly'):
        assert reason_group(spot_check_reason(reason)) == SPOT_CHECK
    assert reason_group("spotted a check") != SPOT_CHECK


def test_strata_are_read_back_from_a_rounds_counts() -> None:
    one, other = Tally(), Tally()
    for _ in range(3):
        one.count_stratum("approved", 0.93)
    one.count_stratum("rejected", None)
    other.count_stratum("rejected", 0.05)
    other.count_stratum("held", 0.2)
    assert list((one + other).verdicts() or {}) == ["approved", "held", "rejected"]  # in order
    assert (one + other).verdicts() == {
        "approved": {"0.9": 3},
        "held": {"0.2": 1},
        "rejected": {"0.0": 1, NO_SCORE: 1},
    }
    assert list(((one + other).verdicts() or {})["rejected"]) == ["0.0", NO_SCORE]  # buckets in order
    assert Tally().verdicts() is None
