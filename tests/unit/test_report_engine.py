"""The run report's engine figures per round (``engine`` in ``report/summary.json``, the **Engine**
table of ``report.md``), added up from the round's accepted jobs' ``engine_stats``: jobs that ran at
once on one engine share its work, so their windows merge instead of adding up twice."""

from __future__ import annotations

import json
from pathlib import Path

from airflow_batchinfer.engines.stats import CounterName
from airflow_batchinfer.run.report.build import build_report, round_engine
from airflow_batchinfer.state.docs import EngineTelemetry, GaugeSpan
from airflow_batchinfer.state.layout import RunLayout
from tests.support.fake_jobs import close, finish_shard, make_run, plan_round


def job(
    engine: str, start: float, seconds: float, gen0: int, gen: int, kv: float, **more: int
) -> EngineTelemetry:
    """A job on ``engine`` from ``start`` for ``seconds``: generated tokens ``gen0`` at its start and
    ``gen`` during it; prefix-cache queries and hits (``queries``, ``hits``) likewise from 0."""
    counters: dict[CounterName, int] = {
        "generation_tokens": gen,
        "prefix_cache_queries": more.get("queries", 0),
        "prefix_cache_hits": more.get("hits", 0),
        "preemptions": more.get("preempted", 0),
    }
    at_start: dict[CounterName, int] = {
        "generation_tokens": gen0,
        "prefix_cache_queries": more.get("queries0", 0),
        "prefix_cache_hits": more.get("hits0", 0),
        "preemptions": 0,
    }
    return EngineTelemetry(
        engine_id=engine, started_at=start, seconds=seconds, samples=3, counters=counters,
        at_start=at_start, gauges={"kv_cache_usage": GaugeSpan(peak=kv, mean=kv / 2)},
    )  # fmt: skip


def test_overlapping_jobs_of_one_engine_count_its_work_once() -> None:
    jobs = [
        # engine a: two jobs at once (its count went 0 -> 150 while either ran), then one alone
        job("a", 0.0, 10.0, 0, 100, 0.5, queries=100, hits=40),
        job("a", 5.0, 10.0, 50, 100, 0.9, queries0=60, queries=100, hits0=20, hits=40, preempted=1),
        job("a", 20.0, 10.0, 200, 50, 0.3, queries0=200, queries=40, hits0=80, hits=0),
        job("b", 0.0, 10.0, 1000, 80, 0.7, queries=60, hits=30),
    ]
    figures = round_engine(jobs)
    assert figures["jobs"] == 4 and figures["engines"] == 2
    # a: [0, 15] grew 150 and [20, 30] grew 50; b: [0, 10] grew 80
    assert figures["engine_seconds"] == 35.0
    assert figures["counters"] == {
        "generation_tokens": 280,
        "prefix_cache_queries": 160 + 40 + 60,
        "prefix_cache_hits": 60 + 0 + 30,
        "preemptions": 1,
    }
    assert figures["generation_tokens_per_s"] == 8.0  # per engine-second
    assert figures["prefix_cache_hit_rate"] == round(90 / 260, 4)
    assert figures["gauges"]["kv_cache_usage"] == {
        "peak": 0.9,
        "mean": 0.3,
    }  # equal lengths: the mean of means


def test_the_report_shows_each_rounds_engine_figures(tmp_path: Path) -> None:
    cfg = make_run(tmp_path, max_rounds=1)
    plan = plan_round(cfg)
    for s in plan.shards:  # the fake's jobs ran at once on one simulated engine
        finish_shard(cfg, 0, s, set())
    close(cfg, plan)
    plan_round(cfg, "tail")
    report = build_report(cfg)
    [r0] = report["engine"]
    assert (r0["round"], r0["slot"], r0["jobs"], r0["engines"]) == (0, "round-00", len(plan.shards), 1)
    assert r0["counters"] == {"generation_tokens": 1, "prompt_tokens": 1, "batches": 1}  # their work, once
    assert r0["gauges"] == {"running": {"peak": 1.0, "mean": 0.5}}
    stored = json.loads((Path(cfg.run_root) / "report" / "summary.json").read_text())
    assert stored["engine"] == report["engine"]
    md = (Path(cfg.run_root) / "report" / "report.md").read_text()
    table = md.split("## Engine", 1)[1]
    assert f"| 0 | {len(plan.shards)} | 1 | 1 | " in table  # round, jobs, engines, generated tokens
    assert "| – / – | 1 | – |" in table  # no KV cache figures from this engine; running peak 1


def test_a_run_from_before_engine_stats_reports_none(tmp_path: Path) -> None:
    cfg = make_run(tmp_path, max_rounds=1)
    plan = plan_round(cfg)
    for s in plan.shards:
        finish_shard(cfg, 0, s, set())
    close(cfg, plan)
    layout = RunLayout(cfg.run_root)
    for s in plan.shards:  # accepted docs as close wrote them before engine_stats existed
        path = Path(layout.accepted(0, s.shard_id, "infer_judge"))
        doc = json.loads(path.read_text())
        del doc["engine_stats"]
        path.write_text(json.dumps(doc))
    plan_round(cfg, "tail")
    report = build_report(cfg)
    assert report["engine"] == []
    assert "## Engine" not in (Path(cfg.run_root) / "report" / "report.md").read_text()
