"""``plan_run``: shard size, lanes, the straggler's wall and tail, lost work and GPU-hours (pure)."""

from __future__ import annotations

import json
import time

import pytest

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.run.lane_schedule import schedule
from airflow_batchinfer.run.preflight import expected_passes as preflight_passes
from airflow_batchinfer.run.sizing import MIN_JOB_S, choose_records_per_shard, expected_passes, plan_run
from airflow_batchinfer.run.sizing_plan import SIZING_VERSION, SizingPlan, duration
from airflow_batchinfer.spec.settings import setting
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.storage import taper

M = 100_000_000
REC_S = 400 / 2500  # GPU-seconds a record costs alone on a 2,500 tokens/s GPU: 0.16


def test_four_shards_on_two_lanes_with_a_2x_straggler() -> None:
    # lane 0 on the straggler (2 s a shard), lane 1 on a nominal GPU (1 s): t=0 lanes 0, 1 take
    # shards 0, 1; t=1 lane 1 takes 2; t=2 both free, lane 0 first takes 3 (ends at 4), lane 1 is out
    s = schedule([1.0] * 4, gpus=2, lanes=2, straggler=2.0)
    assert s.taken_by == (0, 1, 1, 0)
    assert s.lane_end == (4.0, 2.0) and s.gpu_busy_s == (4.0, 2.0)
    assert (s.wall_s, s.tail_s) == (4.0, 2.0)
    # a fifth shard goes to lane 1 at t=2: it runs out at 3, the straggler's lane at 4
    s = schedule([1.0] * 5, gpus=2, lanes=2, straggler=2.0)
    assert s.taken_by == (0, 1, 1, 0, 1) and s.lane_end == (4.0, 3.0)
    assert (s.wall_s, s.tail_s) == (4.0, 1.0)


def test_jobs_on_one_gpu_share_its_rate() -> None:
    # two lanes on one GPU: shards of 1 and 3 GPU-s run at half rate each; the first ends at 2, then
    # the other runs alone at the full rate: its last 2 GPU-s take 2 s. The GPU never idles.
    s = schedule([1.0, 3.0], gpus=1, lanes=2)
    assert s.lane_end == (2.0, 4.0) and s.gpu_busy_s == (4.0,)
    # a third shard (1 GPU-s) taken at 2 by lane 0 shares again: it ends at 4, shard 1's last at 5
    s = schedule([1.0, 3.0, 1.0], gpus=1, lanes=2)
    assert s.taken_by == (0, 1, 0) and s.lane_end == (4.0, 5.0)


def test_lanes_freed_together_spread_over_the_gpus() -> None:
    # 64 one-second shards on 64 lanes over 32 GPUs: two jobs a GPU end together at 2, nobody idles
    r = plan_run(64, 32, 100, concurrency=10, tokens_per_record=100, records_per_shard=1, straggler=1.0)
    (r0,) = r.rounds
    assert (r0.lanes, r0.mapped_tasks, r0.wall_s, r0.tail_idle_gpu_s, r0.tail_s) == (64, 64, 2.0, 0.0, 0.0)
    # 33 shards: GPU 0 runs two (lanes 0 and 32), the 31 others one: they wait 1 s for it
    (r0,) = plan_run(
        33, 32, 100, concurrency=10, tokens_per_record=100, records_per_shard=1, straggler=1.0
    ).rounds
    assert (r0.wall_s, r0.tail_idle_gpu_s, r0.tail_s) == (2.0, 31.0, 1.0)


def test_the_100m_example_runs_on_lanes_with_hour_long_jobs() -> None:
    plan = plan_run(M, 32, 2500, concurrency=10, chunk_size=2000)
    assert plan.slots == 320 and plan.chosen and plan.straggler == 1.5
    assert plan.pool_command == 'airflow pools set batchinfer 320 "batchinfer shard slots" --include-deferred'
    (r,) = plan.rounds
    # a job shares its GPU with 9 others: 10 × rps × 0.16 s <= 3600 s, so rps <= 2,250, to 2,000 (a chunk)
    # round 0's last shards taper down to 1,000 records (storage.taper): 443 more shards
    assert r.records_per_shard == 2000 and r.shards == 50_443
    assert r.job_s == pytest.approx(10 * 2000 * REC_S) and r.job_s <= 3600
    assert r.slowest_job_s == pytest.approx(1.5 * r.job_s)
    assert r.lanes == plan.lanes == r.mapped_tasks == 320 <= 1024
    assert r.shards_per_lane == pytest.approx(50_443 / 320)
    # 16M GPU-s of work on 31 GPUs and one at 2/3 of the rate; list scheduling ends within one job
    ideal = M * REC_S / (31 + 1 / 1.5)
    assert ideal <= r.wall_s <= ideal + r.slowest_job_s
    assert r.tail_s <= r.slowest_job_s
    assert r.busy_gpu_s == pytest.approx(32 * ideal, rel=1e-3)  # every GPU busy but for the tail
    assert r.gpu_hours * 3600 == pytest.approx(r.busy_gpu_s + r.tail_idle_gpu_s, rel=1e-6)
    assert r.tail_idle_fraction < 0.005
    # a lost worker: its 10 jobs redo one chunk each
    assert plan.lost_records_per_failure == 10 * 2000
    assert plan.lost_gpu_s_per_failure == pytest.approx(10 * 2000 * REC_S)
    # a lane runs ~158 hour-long jobs: 140 h, over the 12 h execution_timeout, and the plan says whose bound
    assert any(
        "a lane runs about 158 shard jobs" in n and "gives the lane tasks none" in n for n in plan.notes
    )
    assert not any("over the 12.0 h execution_timeout" in n for n in plan.notes)  # no job is over it


def test_round_0_tapers_and_its_tail_shortens() -> None:
    # 1,000 shards of 100,000 records on 320 lanes, one GPU 1.5x slower: the same work cut finer at
    # the end (storage.taper, as the shard task cuts the input) ends the lanes hours closer together
    flat = schedule([100_000 * REC_S] * 1000, gpus=32, lanes=320, straggler=1.5)
    sizes = taper.sizes(M, 100_000, 320)
    assert len(sizes) == 2330 and sum(sizes) == M and min(sizes[:-1]) == 12_500
    tapered = schedule([n * REC_S for n in sizes], gpus=32, lanes=320, straggler=1.5)
    assert tapered.tail_s < flat.tail_s / 2 and tapered.wall_s < flat.wall_s
    r0 = plan_run(M, 32, 2500, concurrency=10, records_per_shard=100_000).rounds[0]
    assert (r0.shards, r0.tail_s, r0.wall_s) == (2330, round(tapered.tail_s, 3), round(tapered.wall_s, 3))
    # a round of recompacted rejects is not tapered
    again = plan_run(M, 32, 2500, concurrency=10, records_per_shard=100_000, approval_rate=0.8, max_rounds=2)
    assert [r.shards for r in again.rounds] == [2330, 200]


def test_the_shard_size_follows_the_job_target_with_a_floor() -> None:
    # jobs of at most 10 min at 10 jobs a GPU: 375 records, not a multiple of the chunk: kept
    assert choose_records_per_shard(M, 10, 320, REC_S, chunk_size=2000, max_job_s=600) == 375
    # a chunk multiple when above the floor: 11,250 -> 10,000
    assert choose_records_per_shard(M, 2, 64, REC_S, chunk_size=2000, max_job_s=3600) == 10_000
    # few records: one shard a lane, unless that is under the floor (60 s of a job)
    assert choose_records_per_shard(1_000_000, 10, 320, REC_S, chunk_size=500, max_job_s=3600) == 2000
    floor = choose_records_per_shard(1000, 10, 320, REC_S, chunk_size=500, max_job_s=3600)
    assert floor == 38 and 10 * floor * REC_S >= MIN_JOB_S > 10 * (floor - 1) * REC_S
    assert choose_records_per_shard(5, 10, 320, REC_S) == 5  # never more than the records
    # fewer lanes than slots: fewer jobs share a GPU, so a shard may hold more for the same job time
    few = plan_run(M, 32, 2500, concurrency=10, lanes=64, chunk_size=2000)
    assert few.rounds[0].lanes == 64 and few.records_per_shard == 10_000
    assert few.rounds[0].job_s == pytest.approx(2 * 10_000 * REC_S)
    assert few.lost_records_per_failure == 2 * 2000  # two jobs a GPU
    assert any("256 slots stay empty" in n for n in few.notes)


def test_a_given_shard_size_is_not_capped_by_max_map_length() -> None:
    plan = plan_run(M, 32, 2500, concurrency=10, records_per_shard=1000, chunk_size=2000, straggler=1.0)
    assert not plan.chosen and plan.rounds[0].shards == 100_000 and plan.lanes == 320
    assert plan.lost_records_per_failure == 10 * 1000  # a job smaller than a chunk loses at most itself
    big = plan_run(M, 32, 2500, concurrency=10, records_per_shard=100_000, chunk_size=2000)
    (better,) = [n for n in big.notes if "records_per_shard=2,000" in n]
    assert "records_per_shard=100,000 makes jobs of 44.4 h" in better
    assert any("66.7 h on the slowest GPU, over the 12.0 h execution_timeout" in n for n in big.notes)


def test_rounds_rerun_the_rejected_share() -> None:
    plan = plan_run(M, 32, 2500, concurrency=10, approval_rate=0.8, max_rounds=3, chunk_size=2000)
    assert [r.records for r in plan.rounds] == [M, 20_000_000, 4_000_000]
    assert [r.shards for r in plan.rounds] == [50_443, 10_000, 2000]  # then recompacted into full shards
    assert [r.lanes for r in plan.rounds] == [320] * 3
    assert plan.expected_passes == pytest.approx(1.24)
    assert plan.wall_s == pytest.approx(sum(r.wall_s for r in plan.rounds))
    assert plan.tail_s == pytest.approx(sum(r.tail_s for r in plan.rounds))
    assert plan.gpu_hours == pytest.approx(sum(r.gpu_hours for r in plan.rounds), rel=1e-5)
    assert any("800,000 records are still rejected after 3 rounds" in n for n in plan.notes)
    assert len(plan_run(M, 32, 2500, approval_rate=1.0, max_rounds=3).rounds) == 1


@pytest.mark.parametrize("strategy", ["rounds", "in_place", "hybrid"])
def test_expected_passes_match_the_preflight_and_the_rounds(strategy: str) -> None:
    cfg = RunConfig.of(input="x", run_root="y", prompt_template="{{ q }}", judge={"type": "llm"},
                       strategy=strategy, max_rounds=2, max_attempts=3)  # fmt: skip
    passes = expected_passes(0.6, strategy, 2, 3)
    assert passes == preflight_passes(0.6, cfg)
    plan = plan_run(1_000_000, 8, 1000, concurrency=4, approval_rate=0.6, max_rounds=2, strategy=strategy,
                    max_attempts=3, straggler=1.0)  # fmt: skip
    assert plan.expected_passes == pytest.approx(passes, abs=1e-4)
    busy = sum(r.busy_gpu_s for r in plan.rounds)
    assert busy == pytest.approx(1_000_000 * passes * 0.4, rel=1e-3)
    modes = {"rounds": ["rounds"] * 2, "in_place": ["in_place"], "hybrid": ["rounds", "rounds", "in_place"]}
    assert [r.mode for r in plan.rounds] == modes[strategy]


def test_small_datasets_and_the_default_settings() -> None:
    plan = plan_run(1000, 32, 2500, concurrency=10, chunk_size=500)
    assert plan.rounds[0].shards == 27 and plan.lanes == 27  # a lane per shard, none idle
    r = plan_run(5, 32, 2500).rounds[0]
    assert (r.shards, r.records_per_shard, r.lanes) == (1, 5, 1)
    assert plan_run(1000, 3, 2500).slots == 3 * setting("concurrency").default
    assert plan_run(1000, 3, 2500).chunk_size == setting("chunk_size").default


def test_every_plan_adds_up() -> None:
    cases = [
        (M, 32, 10, None, 0),
        (12_345, 3, 7, 100, 0),
        (999, 5, 2, None, 4),
        (7, 1, 1, 3, 0),
        (M, 100, 10, None, 1000),
    ]
    for records, gpus, conc, rps, lanes in cases:
        plan = plan_run(records, gpus, 1234.5, concurrency=conc, records_per_shard=rps, approval_rate=0.5,
                        max_rounds=3, lanes=lanes)  # fmt: skip
        for r in plan.rounds:
            assert r.lanes <= min(plan.slots, r.shards) and r.mapped_tasks <= max(r.shards, 1)
            assert r.gpu_hours * 3600 == pytest.approx(r.busy_gpu_s + r.tail_idle_gpu_s, rel=1e-4, abs=0.5)
            assert r.wall_s * gpus >= r.busy_gpu_s - 1e-6 and 0 <= r.tail_s <= r.wall_s


def test_to_dict_is_versioned_json_and_reads_back() -> None:
    plan = plan_run(M, 32, 2500, concurrency=10, records_per_shard=100_000, approval_rate=0.8, max_rounds=2)
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["version"] == SIZING_VERSION and data["rounds"][0]["shards"] == 2330 and data["slots"] == 320
    assert "per_shard" not in data
    assert SizingPlan.from_dict(data) == plan
    with pytest.raises(
        ConfigError, match="sizing plan version None, this release reads 3: run `batchinfer plan`"
    ):
        SizingPlan.from_dict({k: v for k, v in data.items() if k != "version"})
    with pytest.raises(ConfigError, match=r"unknown \['waves'\]"):
        SizingPlan.from_dict({**data, "rounds": [{**data["rounds"][0], "waves": 4}]})
    table = plan.table()
    assert (
        "airflow pools set batchinfer 320" in table and "320 of 1,024" in table and "total: 2 rounds" in table
    )
    assert (
        "lost to one worker failure: 5,000 records, 13.3 GPU-min" in table
        and "one task per shard" not in table
    )


def test_planning_50k_shards_stays_fast() -> None:
    t0 = time.perf_counter()
    plan_run(M, 32, 2500, concurrency=10, chunk_size=2000)
    assert time.perf_counter() - t0 < 5  # a generous bound: a quadratic simulation takes minutes


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
        ({"chunk_size": 0}, "chunk_size must be"),
        ({"max_job_s": 0}, "max_job_s must be > 0"),
        ({"lanes": -1}, "lanes (0: one per pool slot) must be a whole number >= 0"),
        ({"straggler": 0.5}, "straggler must be a finite number >= 1"),
        ({"straggler": float("nan")}, "straggler must be"),
        ({"straggler": float("inf")}, "straggler must be"),
        ({"lanes": 2000}, "2,000 lanes, but a round maps one task per lane and max_map_length is 1,024"),
        ({"gpus": 128}, "1,280 lanes \\(one per pool slot\\), but"),
    ],
)
def test_bad_input_is_a_config_error_with_the_remedy(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"records": M, "gpus": 32, "tokens_per_s": 2500.0, "concurrency": 10, **kwargs}
    pattern = message if "\\" in message else message.replace("(", r"\(").replace(")", r"\)")
    with pytest.raises(ConfigError, match=pattern) as err:
        plan_run(**args)  # type: ignore[arg-type]
    if "lanes" in message and "map" in message:
        assert "set the run setting lanes (--lanes) to at most 1,024" in str(err.value)
        assert "AIRFLOW__CORE__MAX_MAP_LENGTH" in str(err.value)


def test_duration() -> None:
    assert [duration(s) for s in (51.2, 750, 166_667)] == ["51 s", "12.5 min", "46.3 h"]
