"""``plan_run``: shards, waves, tail idle and GPU-hours from records, GPUs and tokens/s (pure)."""

from __future__ import annotations

import json

import pytest

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.preflight import expected_passes as preflight_passes
from airflow_batchinfer.run.config import RunConfig
from airflow_batchinfer.settings import setting
from airflow_batchinfer.sizing import (
    SizingPlan,
    choose_records_per_shard,
    duration,
    expected_passes,
    plan_run,
)

M = 100_000_000


def test_the_100m_on_320_slots_example_picks_three_full_waves() -> None:
    plan = plan_run(M, 32, 2500, concurrency=10)  # 400 tokens a record: 0.16 GPU-s each
    assert plan.slots == 320 and plan.chosen
    assert plan.pool_command == 'airflow pools set batchinfer 320 "batchinfer shard slots" --include-deferred'
    (r,) = plan.rounds
    assert r.records_per_shard == 104_167 >= -(-M // 1024)  # at least 97,657 to stay under 1,024
    assert (r.shards, r.waves, r.wave_fill, r.last_wave_shards, r.tail_empty_slots) == (960, 3, 3.0, 320, 0)
    full_wave = 10 * 104_167 * 0.16
    assert r.job_s == pytest.approx(full_wave)
    assert r.wall_s == pytest.approx(3 * full_wave)
    assert r.busy_gpu_s == pytest.approx(M * 0.16)
    # the one short shard (103,847 records) leaves its GPU 320 records early: the only idle
    assert r.tail_idle_gpu_s == pytest.approx(320 * 0.16, abs=0.01)
    assert r.tail_idle_fraction < 1e-5
    assert r.gpu_hours == pytest.approx(32 * 3 * full_wave / 3600, rel=1e-6)
    assert plan.gpu_hours == pytest.approx(r.gpu_hours) and plan.expected_passes == 1.0
    # 46 h shard jobs: over the default 12 h execution_timeout, and the plan says so
    assert any("execution_timeout" in n for n in plan.notes)


def test_a_shard_count_off_the_slot_multiple_leaves_a_tail_and_the_plan_says_the_better_size() -> None:
    plan = plan_run(M, 32, 2500, concurrency=10, records_per_shard=100_000)
    (r,) = plan.rounds
    assert not plan.chosen
    assert (r.shards, r.waves, r.wave_fill) == (1000, 4, 3.125)
    assert (r.last_wave_shards, r.tail_empty_slots) == (40, 280)
    # last wave: 40 shards round-robin over 32 GPUs, 8 GPUs get two; a GPU with one job runs it at the
    # GPU's full rate, so it idles only after it: 24 GPUs × one job's time, not 280 empty slots' worth
    one_job = 100_000 * 0.16
    assert r.wall_s == pytest.approx(3 * 10 * one_job + 2 * one_job)
    assert r.tail_idle_s == pytest.approx(one_job)
    assert r.tail_idle_gpu_s == pytest.approx(24 * one_job)
    assert r.tail_idle_fraction == pytest.approx(24 / (32 * 32), abs=1e-6)
    (better,) = [n for n in plan.notes if "records_per_shard=104,167" in n]
    assert "960 shards in 3 waves" in better and "3.12 waves" in better


def test_the_gpu_not_the_slot_is_the_unit_of_idle() -> None:
    # 64 shards on 32 GPUs × 10: one wave a fifth full, yet every GPU has two jobs: no idle at all
    r = plan_run(64, 32, 100, concurrency=10, tokens_per_record=100, records_per_shard=1).rounds[0]
    assert (r.waves, r.tail_empty_slots, r.tail_idle_gpu_s, r.wall_s) == (1, 256, 0.0, 2.0)
    # 33 shards: one GPU runs two, 31 wait for it
    r = plan_run(33, 32, 100, concurrency=10, tokens_per_record=100, records_per_shard=1).rounds[0]
    assert (r.wall_s, r.tail_idle_gpu_s, r.tail_idle_s) == (2.0, 31.0, 1.0)


def test_rounds_rerun_the_rejected_share() -> None:
    plan = plan_run(M, 32, 2500, concurrency=10, approval_rate=0.8, max_rounds=3)
    assert [r.records for r in plan.rounds] == [M, 20_000_000, 4_000_000]
    assert [r.shards for r in plan.rounds] == [960, 192, 39]  # recompacted into full shards
    assert plan.expected_passes == pytest.approx(1.24)
    assert plan.wall_s == pytest.approx(sum(r.wall_s for r in plan.rounds))
    assert plan.gpu_hours == pytest.approx(sum(r.gpu_hours for r in plan.rounds), rel=1e-5)
    # round 2: 39 shards on 32 GPUs, 7 GPUs run two: their wait is the tail
    last = plan.rounds[2]
    assert last.waves == 1 and last.tail_idle_fraction == pytest.approx(0.4, abs=0.01)
    assert any("800,000 records are still rejected after 3 rounds" in n for n in plan.notes)
    # everything approved: nothing to re-run
    assert len(plan_run(M, 32, 2500, approval_rate=1.0, max_rounds=3).rounds) == 1


@pytest.mark.parametrize("strategy", ["rounds", "in_place", "hybrid"])
def test_expected_passes_match_the_preflight_and_the_rounds(strategy: str) -> None:
    cfg = RunConfig(input="x", run_root="y", prompt_template="{{ q }}", judge={"type": "llm"},
                    strategy=strategy, max_rounds=2, max_attempts=3)  # fmt: skip
    passes = expected_passes(0.6, strategy, 2, 3)
    assert passes == preflight_passes(0.6, cfg)
    plan = plan_run(1_000_000, 8, 1000, concurrency=4, approval_rate=0.6, max_rounds=2, strategy=strategy,
                    max_attempts=3)  # fmt: skip
    assert plan.expected_passes == pytest.approx(passes, abs=1e-4)
    busy = sum(r.busy_gpu_s for r in plan.rounds)
    assert busy == pytest.approx(1_000_000 * passes * 0.4, rel=1e-3)
    modes = {"rounds": ["rounds"] * 2, "in_place": ["in_place"], "hybrid": ["rounds", "rounds", "in_place"]}
    assert [r.mode for r in plan.rounds] == modes[strategy]


def test_more_slots_than_a_round_maps_fills_every_gpu_equally() -> None:
    plan = plan_run(M, 128, 2500, concurrency=10)
    (r,) = plan.rounds
    assert r.shards == 1024 and r.shards % 128 == 0 and r.records_per_shard == 97_657
    assert r.tail_idle_fraction < 1e-4
    assert any("more than one round maps" in n for n in plan.notes)


def test_small_datasets() -> None:
    assert choose_records_per_shard(1000, 32, 10, 1024) == 32  # 32 shards: a multiple of the GPUs
    plan = plan_run(1000, 32, 2500)
    assert plan.rounds[0].shards == 32 and any("Airflow spends" in n for n in plan.notes)
    r = plan_run(5, 32, 2500).rounds[0]
    assert (r.shards, r.records_per_shard) == (5, 1)
    assert r.tail_idle_gpu_s == pytest.approx(27 * 0.16)  # 27 GPUs never get a job


def test_the_default_concurrency_is_the_settings_one() -> None:
    assert plan_run(1000, 3, 2500).slots == 3 * setting("concurrency").default


def test_every_plan_adds_up() -> None:
    for records, gpus, conc, rps in [(M, 32, 10, None), (12_345, 3, 7, 100), (999, 5, 2, None), (7, 1, 1, 3)]:
        plan = plan_run(records, gpus, 1234.5, concurrency=conc, records_per_shard=rps, approval_rate=0.5,
                        max_rounds=3)  # fmt: skip
        for r in plan.rounds:
            assert r.shards <= 1024 and r.waves == -(-r.shards // plan.slots)
            assert r.gpu_hours * 3600 == pytest.approx(r.busy_gpu_s + r.tail_idle_gpu_s, rel=1e-4, abs=0.5)
            assert r.wall_s * gpus >= r.busy_gpu_s - 1e-6


def test_to_dict_is_json_and_reads_back() -> None:
    plan = plan_run(M, 32, 2500, concurrency=10, records_per_shard=100_000, approval_rate=0.8, max_rounds=2)
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["rounds"][0]["shards"] == 1000 and data["slots"] == 320
    assert SizingPlan.from_dict(data) == plan
    table = plan.table()
    assert "airflow pools set batchinfer 320" in table and "1,000 of 1,024" in table
    assert "4 (3.12)" in table and "total: 2 rounds" in table


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gpus": 0}, "gpus must be a whole number >= 1"),
        ({"records": 0}, "records must be"),
        ({"tokens_per_s": 0}, "measure it"),
        ({"concurrency": 0}, "concurrency must be"),
        ({"tokens_per_record": -1}, "tokens_per_record must be > 0"),
        ({"approval_rate": 1.5}, "between 0 and 1"),
        ({"strategy": "all"}, "choose one of rounds, in_place, hybrid"),
        ({"records_per_shard": 0}, "records_per_shard must be"),
        ({"records_per_shard": 50_000}, "records_per_shard >= 97,657"),
    ],
)
def test_bad_input_is_a_config_error_with_the_remedy(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"records": M, "gpus": 32, "tokens_per_s": 2500.0, **kwargs}
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as err:
        plan_run(**args)  # type: ignore[arg-type]
    if "records_per_shard" in kwargs and kwargs["records_per_shard"] == 50_000:
        assert "2,000 shards" in str(err.value) and "max_map_length" in str(err.value)


def test_duration() -> None:
    assert [duration(s) for s in (51.2, 750, 166_667)] == ["51 s", "12.5 min", "46.3 h"]
