"""The worker's engine telemetry: one window per job (counters' growth, gauges' peak and mean over
readings taken while it runs), the engine's figures on ``/metrics`` and in each job's manifest."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from airflow_batchinfer.engines import Engine, GenerationRequest, GenerationResult
from airflow_batchinfer.engines.stats import EngineStats
from airflow_batchinfer.state.docs import read_job_manifest
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.worker import metrics
from airflow_batchinfer.worker.registry import JobRegistry
from airflow_batchinfer.worker.runtime import Runtime
from airflow_batchinfer.worker.telemetry import RATE_WINDOW_S, Telemetry
from tests.support.fake_jobs import make_run, plan_round
from tests.support.worker_jobs import run_jobs


class Scripted(Engine):
    """An engine whose stats the test sets (``None``: it keeps none)."""

    name = "scripted"

    def __init__(self) -> None:
        self.now: EngineStats | None = EngineStats()
        self.fail = False

    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        return [GenerationResult("x") for _ in requests]

    def stats(self) -> EngineStats | None:
        if self.fail:
            raise RuntimeError("stats broke")
        return self.now


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def vllm_like(gen: int, *, kv: float, running: int, queries: int = 0, hits: int = 0) -> EngineStats:
    return EngineStats(
        generation_tokens=gen, prompt_tokens=2 * gen, prefix_cache_queries=queries, prefix_cache_hits=hits,
        preemptions=0, running=running, waiting=0, kv_cache_usage=kv,
    )  # fmt: skip


async def test_a_window_has_the_counters_growth_and_the_gauges_peak_and_mean() -> None:
    engine, clock = Scripted(), Clock()
    engine.now = vllm_like(100, kv=0.1, running=1, queries=10, hits=5)
    telemetry = Telemetry(engine, interval_s=0.01, clock=clock)
    window = telemetry.open()
    engine.now = vllm_like(150, kv=0.7, running=5, queries=30, hits=5)
    for _ in range(100):  # the sampling task reads it
        await asyncio.sleep(0.01)
        if window is not None and window.gauges["kv_cache_usage"].peak == 0.7:
            break
    samples = window.readings if window else 0
    engine.now = vllm_like(160, kv=0.3, running=0, queries=30, hits=5)
    clock.t += 2.5
    figures = telemetry.close(window)
    assert figures is not None and figures.engine_id == telemetry.engine_id
    assert figures.seconds == 2.5 and figures.samples == samples + 1 >= 3
    assert figures.counters == {
        "generation_tokens": 60, "prompt_tokens": 120, "prefix_cache_queries": 20, "prefix_cache_hits": 0,
        "preemptions": 0,
    }  # fmt: skip
    assert figures.at_start["generation_tokens"] == 100
    kv = figures.gauges["kv_cache_usage"]
    assert kv.peak == 0.7 and 0.1 < kv.mean < 0.7
    assert figures.gauges["running"].peak == 5
    assert telemetry._task is None  # no job left: no readings


async def test_the_readings_stop_with_the_last_window_and_failures_report_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = Scripted()
    telemetry = Telemetry(engine, interval_s=0.01)
    a, b = telemetry.open(), telemetry.open()
    task = telemetry._task
    assert task is not None
    telemetry.discard(a)  # a job that failed: its window goes, the other job's stays
    assert telemetry._task is task and telemetry.close(a) is None
    engine.fail = True
    with caplog.at_level(logging.ERROR, "airflow_batchinfer.worker"):
        assert telemetry.close(b) is None  # broken stats never fail the job
        assert telemetry.read() is None
    assert len([r for r in caplog.records if "reading its stats failed" in r.message]) == 1
    await asyncio.sleep(0)
    assert telemetry._task is None and task.cancelled()
    engine.fail, engine.now = False, None
    assert telemetry.open() is None  # an engine that keeps no stats has no window


def test_tokens_per_second_over_the_recent_readings() -> None:
    engine, clock = Scripted(), Clock()
    telemetry = Telemetry(engine, clock=clock)
    for k in range(15):
        engine.now = EngineStats(generation_tokens=100 * k, prompt_tokens=10 * k)
        telemetry.read()
        clock.t += 1
    assert telemetry.rates() == {"generation_tokens": 100.0, "prompt_tokens": 10.0}
    assert len(telemetry._recent) == RATE_WINDOW_S + 1  # the older readings are gone
    clock.t += 60
    telemetry.read()  # idle since: one reading, no rate
    assert telemetry.rates() == {}


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams: dict[str, Any], name: str) -> float:
    return float(fams[name].samples[0].value)


async def test_metrics_show_the_engine_figures_it_reports() -> None:
    engine = Scripted()
    engine.now = vllm_like(500, kv=0.42, running=3, queries=200, hits=50)
    registry = JobRegistry(Runtime(engine), concurrency=1)
    fams = families(metrics.render(registry))
    assert value(fams, "batchinfer_engine_generation_tokens") == 500
    assert value(fams, "batchinfer_engine_prompt_tokens") == 1000
    assert value(fams, "batchinfer_engine_prefix_cache_queries") == 200
    assert value(fams, "batchinfer_engine_prefix_cache_hits") == 50
    assert value(fams, "batchinfer_engine_prefix_cache_hit_rate") == 0.25
    assert value(fams, "batchinfer_engine_preemptions") == 0
    assert value(fams, "batchinfer_engine_kv_cache_usage") == 0.42
    assert value(fams, "batchinfer_engine_requests_running") == 3
    assert value(fams, "batchinfer_engine_requests_waiting") == 0
    assert value(fams, "batchinfer_engine_generation_tokens_per_second") == 0  # one reading yet
    assert fams["batchinfer_engine_kv_cache_usage"].type == "gauge"
    assert fams["batchinfer_engine_generation_tokens"].type == "counter"
    assert "batchinfer_engine_batches" not in fams  # not reported: not shown
    engine.now = None
    names = {m.name.removesuffix("_total") for m in metrics.ENGINE_METRICS}
    assert not names & set(families(metrics.render(registry)))


def test_the_manifest_carries_the_simulated_engines_figures(tmp_path: Path) -> None:
    cfg = make_run(tmp_path)
    shard = plan_round(cfg).shards[0]
    # two batches of 0.8 s (inference, then the verdicts): the reading after 1 s is inside one
    run_jobs(cfg, [("infer_judge", 0, shard)], latency_base_s=0.8)
    m = read_job_manifest(RunLayout(cfg.run_root).job_manifest(0, shard.shard_id, "infer_judge"))
    assert m is not None and m.engine_stats is not None
    stats = m.engine_stats
    assert stats.counters["batches"] >= 2  # inference and the judge's verdicts
    assert stats.counters["generation_tokens"] == m.tokens["completion"] > 0
    assert stats.counters["prompt_tokens"] == m.tokens["prompt"]
    assert stats.gauges["running"].peak >= 1 and stats.samples >= 3
    assert set(stats.gauges) == {"running"}  # what the simulated engine can tell
    assert 0 < stats.seconds <= m.timings.run_s + 0.01  # the job's time, give or take rounding
