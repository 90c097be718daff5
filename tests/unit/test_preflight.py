"""``run_preflight`` against an in-process worker (no sockets): the projection and its sizing plan."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from airflow_batchinfer.engines import create_engine
from airflow_batchinfer.run.preflight import _sizing, run_preflight, same_retries, sample_plan
from airflow_batchinfer.run.report.build import build_report
from airflow_batchinfer.run.report.render import render_markdown
from airflow_batchinfer.run.sizing_plan import SIZING_VERSION, SizingPlan
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import write_run_config
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import shard_dataset
from airflow_batchinfer.worker.app import create_app
from airflow_batchinfer.worker.config import WorkerConfig
from airflow_batchinfer.worker.runtime import Runtime

TOKEN = "t" * 32


class InProcessWorker(httpx.AsyncBaseTransport):
    """The worker app over ASGI; its runtime starts on the first request's event loop (the one
    ``run_preflight`` makes) and closes with the client."""

    def __init__(self, tmp_path: Path, concurrency: int) -> None:
        config = WorkerConfig(token=TOKEN, allowed_prefixes=[str(tmp_path)], concurrency=concurrency)
        self.runtime = Runtime(create_engine("simulated", latency_base_s=0.01), batch_timeout_s=0.001)
        self.asgi = httpx.ASGITransport(app=create_app(config, self.runtime))
        self.started = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not self.started:
            self.started = True
            await self.runtime.start()
        return await self.asgi.handle_async_request(request)

    async def aclose(self) -> None:
        if self.started:
            await self.runtime.close()


def test_preflight_adds_the_sizing_plan(tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": i, "q": f"q{i}"}) + "\n" for i in range(100)))
    cfg = RunConfig.of(input=str(data), run_root=str(tmp_path / "run"), prompt_template="{{ q }}",
                       judge={"type": "llm"}, records_per_shard=30, preflight_records=20,
                       max_rounds=2)  # fmt: skip
    shard_dataset(cfg.data.input, RunLayout(cfg.run_root).input, records_per_shard=30)
    write_run_config(cfg)
    summary = run_preflight(cfg, ["http://worker"], TOKEN, transport=InProcessWorker(tmp_path, 3))
    # the keys the operator logs and the budget check reads
    assert summary.sample_records == 20 and summary.dataset_records == 100 and summary.workers == 1
    assert summary.tokens_per_s > 0 and 0 <= summary.approval_rate <= 1
    plan = SizingPlan.from_dict(summary.sizing)
    assert (plan.records, plan.gpus, plan.concurrency, plan.slots) == (100, 1, 3, 3)  # slots from /v1/stats
    assert round(plan.tokens_per_s, 1) == summary.tokens_per_s
    assert plan.rounds[0].shards == 4 and plan.rounds[0].records_per_shard == 30  # the run's shards
    assert plan.max_rounds == 2 and plan.approval_rate == summary.approval_rate
    # the run's lanes (the setting, or one per slot) and chunk_size: what a lost worker redoes
    assert (plan.lanes_setting, plan.lanes, plan.chunk_size) == (0, 3, cfg.sharding.chunk_size)
    assert plan.lost_records_per_failure == 3 * min(cfg.sharding.chunk_size, 30)
    assert summary.sizing["version"] == SIZING_VERSION
    assert summary.projected_wall_s == round(plan.wall_s, 1)
    assert summary.projected_gpu_hours == round(plan.wall_s / 3600, 4)
    stored = json.loads((tmp_path / "run" / "preflight" / "summary.json").read_text())
    assert stored["sizing"] == summary.sizing
    # greedy sampling and no retry template: every retry would repeat its attempt's text
    (warning,) = stored["warnings"]
    assert warning == same_retries(cfg) and warning.startswith("every retry would produce the same text")
    assert f"## Pre-flight warnings\n\n- {warning}" in render_markdown(build_report(cfg))
    # of the settings alone: the report says it without the sample too (preflight_records 0, the CLI)
    (tmp_path / "run" / "preflight" / "summary.json").unlink()
    report = build_report(cfg)
    assert report["preflight"] is None and report["warnings"] == [warning]
    assert f"## Pre-flight warnings\n\n- {warning}" in render_markdown(report)
    # the workers' concurrency can be given instead of asked
    again = run_preflight(cfg, ["http://worker"], TOKEN, concurrency=8, max_map_length=2,
                          transport=InProcessWorker(tmp_path, 3))  # fmt: skip
    # 8 lanes (a slot each) are more than a round maps: no plan, the pre-flight still reports
    assert "8 lanes (one per pool slot), but" in again.sizing["error"]
    assert "max_map_length is 2" in again.sizing["error"]
    assert again.projected_gpu_hours > 0
    # the sample ran what the rounds run: one fused infer_judge job (no inferred file in between)
    preflight = Path(RunLayout(cfg.run_root).preflight)
    assert (preflight / "infer_judge.json").exists() and not (preflight / "inferred.jsonl.zst").exists()


def test_the_sample_is_spread_over_the_input() -> None:
    # 10 shards: the first rows of 8 of them, evenly spaced, an equal share each
    plan = sample_plan([100] * 10, 20)
    assert [i for i, _ in plan] == [0, 1, 2, 3, 5, 6, 7, 8] and sum(t for _, t in plan) == 20
    assert max(t for _, t in plan) - min(t for _, t in plan) <= 1
    # a tapered end (many small shards last): spread by records, not by index (0, 3, 6, ... 21 would
    # sample the last quarter of the records five times out of eight)
    tapered = sample_plan([10] * 8 + [2] * 16, 8)
    assert [i for i, _ in tapered] == [0, 1, 2, 4, 5, 7, 10, 17]
    # a share a small shard cannot fill goes to the next; what the spread cannot fill, to the others
    assert sample_plan([1, 100], 10) == [(0, 1), (1, 9)]
    topped = sample_plan([2] * 20, 30)  # 8 spread shards give 16; 7 more in order give the rest
    assert [i for i, _ in topped] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 15, 17]
    assert sum(t for _, t in topped) == 30
    assert sample_plan([5, 5], 7) == [(0, 4), (1, 3)]
    assert sample_plan([5, 1], 6) == [(0, 5), (1, 1)]  # a spread shard topped up: still read once
    few = sample_plan([3, 3, 3], 20)
    assert few == [(0, 3), (1, 3), (2, 3)]
    assert sample_plan([], 10) == [] and sample_plan([5], 0) == []


def test_preflight_sizing_takes_the_run_lanes_and_chunk_size() -> None:
    cfg = RunConfig.of(input="x", run_root="y", prompt_template="{{ q }}", judge={"type": "llm"},
                       records_per_shard=2000, chunk_size=250)  # fmt: skip
    args = (1_000_000, 4, 10, 2500.0, 400.0, 1.0, 1024)
    plan = SizingPlan.from_dict(_sizing(cfg.replace(lanes=8), *args))
    assert (plan.lanes_setting, plan.lanes, plan.slots, plan.chunk_size) == (8, 8, 40, 250)
    # the run's shards, the last ones tapered for the 8 lanes (storage.taper)
    assert plan.rounds[0].shards == 511 and plan.rounds[0].records_per_shard == 2000
    # given round 0's shards as planned (the pre-flight's), they are the plan's
    given = SizingPlan.from_dict(_sizing(cfg, *args, [2000] * 499 + [1000] * 2))
    assert given.rounds[0].shards == 501 and given.rounds[0].records == 1_000_000
    assert plan.lost_records_per_failure == 2 * 250  # 8 lanes on 4 GPUs: two jobs, a chunk each
    auto = SizingPlan.from_dict(_sizing(cfg, *args))
    assert (auto.lanes_setting, auto.lanes) == (0, 40) and auto.lost_records_per_failure == 10 * 250
    over = _sizing(cfg.replace(lanes=2000), *args)
    assert "2,000 lanes, but a round maps one task per lane" in over["error"]
    assert _sizing(cfg, 1000, 4, None, 2500.0, 400.0, 1.0, 1024) == {
        "error": "no worker answered /v1/stats: its concurrency (job slots) is unknown"
    }


def test_preflight_samples_and_sizes_a_fan_outs_rows(tmp_path: Path) -> None:
    """With ``fan_out`` the sample is rows (each record on each arm) and the projection sizes the rows
    the rounds run, read from round 0's byte ranges as their jobs read them."""
    from airflow_batchinfer.run.prepare import prepare_run
    from airflow_batchinfer.storage import JsonlFile

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": i, "q": f"q{i}"}) + "\n" for i in range(40)))
    lora = tmp_path / "lora-sql"  # within the worker's prefixes (the simulated engine reads no weights)
    lora.mkdir()
    (lora / "adapter_config.json").write_text("{}")
    cfg = RunConfig.of(input=str(data), run_root=str(tmp_path / "run"), prompt_template="{{ q }}",
                       judge={"type": "llm"}, records_per_shard=20, preflight_records=8,
                       adapters={"sql": str(lora)}, fan_out="adapters_and_base")  # fmt: skip
    shards = prepare_run(cfg).shards
    assert all(s.is_range for s in shards)
    summary = run_preflight(cfg, ["http://worker"], TOKEN, transport=InProcessWorker(tmp_path, 2))
    planned = sum(s.records for s in shards)  # the ranges' estimates, 2 rows a line
    assert summary.sample_records == 8 and summary.dataset_records == planned and planned % 2 == 0
    assert SizingPlan.from_dict(summary.sizing).records == planned
    sample = list(JsonlFile(str(Path(RunLayout(cfg.run_root).preflight) / "sample.jsonl.zst")).iter_records())
    assert {r["adapter"] for r in sample} == {"base", "sql"}
    assert all(r["id"] == f"{r['input_id']}@{r['adapter']}" for r in sample)
