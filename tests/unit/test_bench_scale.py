"""bench/scale.py's figures that are computed, not measured: the round's tail, a lane task's
overhead, the phases, Ray's batch size and latency model (so the side-by-side run is the same
workload), and the skip without Ray."""

from __future__ import annotations

import argparse
import hashlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.engines.base import GenerationRequest, SamplingParams
from airflow_batchinfer.engines.simulated import SimulatedEngine
from bench import scale
from bench.scale_dag import analyse, round_tail, timeline
from bench.scale_ray import Engine, answer

T0 = 1_800_000_000.0


def iso(t: float) -> str:
    return datetime.fromtimestamp(T0 + t, UTC).isoformat()


def manifest(start: float, end: float, run_s: float | None = None) -> dict[str, Any]:
    return {"timings": {"started_at": T0 + start, "finished_at": T0 + end, "run_s": run_s or end - start}}


def lane(i: int, ends: list[float]) -> dict[str, Any]:
    shards = [
        {
            "shard_id": f"part-{i}{k}",
            "records": 20,
            "state": "done",
            "claimed_at": T0 + e - 1,
            "ended_at": T0 + e,
        }
        for k, e in enumerate(ends)
    ]
    return {"lane": i, "round": 0, "shards": shards}


def test_tail_runs_from_the_first_lane_out_of_shards_to_the_last_job_end() -> None:
    lanes = [lane(0, [5, 20]), lane(1, [8, 30]), lane(2, [])]  # lane 2 never got a shard
    jobs = {(s["shard_id"], "infer_judge"): manifest(s["claimed_at"] - T0, s["ended_at"] - T0)
            for d in lanes for s in d["shards"]}  # fmt: skip
    tail = round_tail(lanes, jobs)
    assert tail["source"] == "lane documents"
    assert tail["tail_s"] == 10.0  # lane 0 ran out at 20, the last job ended at 30
    assert tail["lanes_without_shards"] == 1
    assert tail["shards_per_lane_min_max"] == [0, 2]


def test_tail_of_a_round_mapped_per_shard_starts_at_the_first_slot_freed_with_nothing_left() -> None:
    # the last job starts at 12; the first job to end after that (at 14) frees a slot with no shard
    jobs = {("a", "k"): manifest(0, 10), ("b", "k"): manifest(2, 14), ("c", "k"): manifest(12, 19)}
    assert round_tail([], jobs) == {"source": "job manifests", "tail_s": 5.0}


def test_a_lane_tasks_overhead_is_its_duration_less_its_own_shards_jobs() -> None:
    lanes = [lane(0, [10]), lane(1, [20, 30])]
    jobs = {
        ("part-00", "infer_judge"): manifest(0, 10, run_s=8.0),
        ("part-10", "infer_judge"): manifest(0, 20, run_s=6.0),
        ("part-11", "infer_judge"): manifest(20, 30, run_s=7.0),
    }
    # a lane's map index is its lane: the plan's shard at that index is not its shard
    tis = [
        {"task_id": "round_00.lanes", "map_index": i, "state": "success", "id": str(i),
         "start_date": iso(0), "end_date": iso(d), "queued_when": iso(0)}
        for i, d in ((0, 12.0), (1, 40.0))
    ]  # fmt: skip
    kinds = analyse(tis, jobs, ["part-10", "part-00"], {}, {}, T0, lanes)
    assert kinds["lanes"]["overhead"]["n"] == 2
    assert kinds["lanes"]["overhead"]["sum"] == round((12.0 - 8.0) + (40.0 - 13.0), 1)


def test_timeline_orders_phases_by_start_and_leaves_out_tasks_that_never_ran() -> None:
    tis = [
        {"task_id": "report", "map_index": -1, "start_date": iso(40), "end_date": iso(41)},
        {"task_id": "round_00.lanes", "map_index": 1, "start_date": iso(6), "end_date": iso(30)},
        {
            "task_id": "round_00.lanes",
            "map_index": 0,
            "start_date": iso(5),
            "end_date": iso(35),
            "try_number": 2,
        },
        {"task_id": "pool_setup", "map_index": -1, "start_date": iso(1), "end_date": iso(4)},
        {"task_id": "tail.lanes", "map_index": -1, "start_date": None, "end_date": None},  # skipped
        # skipped by a close that folded the tail: the skip stamps a start and an end
        {"task_id": "tail.plan", "map_index": -1, "state": "skipped", "start_date": iso(42),
         "end_date": iso(42)},
    ]  # fmt: skip
    phases = timeline(tis, T0)
    assert [p["task"] for p in phases] == ["pool_setup", "round_00.lanes", "report"]
    assert phases[1] == {
        "task": "round_00.lanes",
        "n": 2,
        "start": 5.0,
        "end": 35.0,
        "span": 30.0,
        "retried": 1,
    }


def test_rays_batches_hold_about_the_workers_token_budget() -> None:
    # 100k records of 22,547,875 tokens (seed 0): 225.5 tokens a record, 32,000 / 225.5 = 141.9
    assert scale.ray_batch_size(32_000, 22_547_875, 100_000) == 142
    assert scale.ray_batch_size(100, 10_000, 10) == 1  # records larger than the budget: one each


async def test_rays_batch_call_takes_and_answers_what_the_simulated_engine_does() -> None:
    prompts = ["x" * n for n in (0, 3, 4, 199, 1596)]
    a, b = 0.005, 2e-6
    requests = [
        GenerationRequest(f"r{i}", prompt=p, sampling=SamplingParams(max_tokens=1))
        for i, p in enumerate(prompts)
    ]
    engine = SimulatedEngine(latency_base_s=a, latency_per_token_s=b, completion_tokens=0)
    tokens = sum(
        r.prompt_chars() // 4 + 1 + min(engine.completion_tokens, r.sampling.max_tokens) for r in requests
    )
    assert Engine(a, b).latency_s(prompts) == pytest.approx(a + b * tokens)
    results = await engine.generate(requests)
    assert [f"simulated answer {answer(p)}" for p in prompts] == [r.text for r in results]
    assert answer("q") == hashlib.sha256(b"q\x1f1").hexdigest()[:16]


def test_without_the_ray_venv_part_e_says_how_to_get_it_and_skips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(scale, "RAY_PYTHON", tmp_path / "no-venv" / "bin" / "python")
    args = argparse.Namespace(target_batch_tokens=32_000, records=10, gpus=2, a=0.005, b=2e-6, dag_timeout=60)
    assert scale.part_ray(args, tmp_path, tmp_path / "data.jsonl", 2_000, 1.0) is None
    assert "Ray Data not installed: run make ray-venv" in capsys.readouterr().out
