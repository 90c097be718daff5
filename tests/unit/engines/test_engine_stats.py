"""Each engine's ``stats()``: vLLM's stat-logger counts (fed as vLLM's output loop feeds them), and
what the simulated, openai and transformers engines can tell of themselves."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from airflow_batchinfer.engines import GenerationRequest, create_engine
from airflow_batchinfer.engines.openai import OpenAIEngine
from airflow_batchinfer.engines.stats import COUNTERS, GAUGES, EngineStats
from airflow_batchinfer.engines.vllm import VllmEngine
from airflow_batchinfer.exceptions import ConfigError
from tests.support.engine_stats import reported


def test_one_list_of_names_for_the_stats() -> None:
    assert [f.name for f in dataclasses.fields(EngineStats)] == [*COUNTERS, *GAUGES]
    s = EngineStats(generation_tokens=3, kv_cache_usage=0.25)
    assert s.counters() == {"generation_tokens": 3} and s.gauges() == {"kv_cache_usage": 0.25}


def step(
    *,
    gen: int = 0,
    prompt: int = 0,
    preempted: int = 0,
    running: int = 0,
    waiting: int = 0,
    deferred: int = 0,
    kv: float = 0.0,
    queries: int = 0,
    hits: int = 0,
) -> tuple[Any, Any]:
    """One engine step's (scheduler stats, iteration stats), shaped as vLLM 0.32 hands them over."""
    scheduler = SimpleNamespace(
        num_running_reqs=running,
        num_waiting_reqs=waiting,
        num_skipped_waiting_reqs=deferred,
        kv_cache_usage=kv,
        prefix_cache_stats=SimpleNamespace(queries=queries, hits=hits),
    )
    iteration = SimpleNamespace(
        num_generation_tokens=gen, num_prompt_tokens=prompt, num_preempted_reqs=preempted
    )
    return scheduler, iteration  # fmt: skip


def test_vllm_stats_add_up_every_step_of_every_engine_core() -> None:
    engine = VllmEngine("/models/m", max_model_len=512)
    assert engine.stats() is None  # not started: nothing to tell
    core0, core1 = engine._recorder(None, 0), engine._recorder(None, 1)  # vLLM calls its factory per core
    sched, it = step(prompt=40, queries=40, running=2, waiting=3, deferred=1, kv=0.5)
    core0.record(sched, it)
    core0.record(*step(gen=2, running=2, kv=0.6))
    core0.record(None, None)  # a step without stats changes nothing
    core1.record(*step(gen=5, prompt=10, preempted=1, queries=32, hits=16, running=1, kv=0.2))
    stats = engine.stats()
    assert stats is not None and stats.kv_cache_usage is not None
    assert dataclasses.replace(stats, kv_cache_usage=round(stats.kv_cache_usage, 6)) == EngineStats(
        generation_tokens=7,
        prompt_tokens=50,
        prefix_cache_queries=72,
        prefix_cache_hits=16,
        preemptions=1,
        running=3,  # the last step's, per core, added up
        waiting=0,
        kv_cache_usage=0.4,  # the cores' mean
    )
    assert reported(stats) == set(VllmEngine.stats_fields)  # what the docs say it reports
    assert "log_stats_interval_s" not in engine.describe()["args"]


def test_vllm_stats_turn_off_on_a_step_they_cannot_read(caplog: pytest.LogCaptureFixture) -> None:
    engine = VllmEngine("/models/m")
    recorder = engine._recorder(None, 0)
    recorder.record(*step(gen=1))
    with caplog.at_level(logging.WARNING, "airflow_batchinfer.engines.vllm"):
        recorder.record(SimpleNamespace(), None)  # a vLLM whose SchedulerStats changed shape
        recorder.record(SimpleNamespace(), None)
    assert engine.stats() is None  # no half-counted figures
    assert [r.message for r in caplog.records if "engine stats" in r.message] == [
        "vllm: cannot read this vLLM's engine stats ('types.SimpleNamespace' object has no attribute "
        "'num_running_reqs'): no engine telemetry here"
    ]


@pytest.mark.parametrize("value", [0, 0.5, -1, "10", True])
def test_vllm_log_interval_is_a_number_of_seconds(value: object) -> None:
    with pytest.raises(ConfigError, match=r"log_stats_interval_s=.*at least 1 .*leave it unset"):
        VllmEngine("/models/m", log_stats_interval_s=value)
    assert VllmEngine("/models/m", log_stats_interval_s=5).log_stats_interval_s == 5.0


async def test_the_simulated_engine_counts_its_batches_and_the_requests_in_them() -> None:
    engine = create_engine("simulated", latency_base_s=0.05, completion_tokens=4)
    reqs = [GenerationRequest(str(i), prompt="x" * 40) for i in range(3)]
    task = asyncio.create_task(engine.generate(reqs))
    await asyncio.sleep(0.01)
    during = engine.stats()
    await task
    await engine.generate(reqs[:1])
    assert during is not None and during.running == 3
    assert engine.stats() == EngineStats(generation_tokens=16, prompt_tokens=44, batches=2, running=0)
    assert reported(engine.stats()) == set(engine.stats_fields)


async def test_the_openai_engine_counts_the_usage_its_server_reports() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        usage = {"prompt_tokens": 3, "completion_tokens": 2}
        return httpx.Response(
            200, json={"choices": [{"text": "ok", "finish_reason": "stop"}], "usage": usage}
        )

    engine = OpenAIEngine(
        "m", base_url="http://llm.local/v1", api_key="k", transport=httpx.MockTransport(handler)
    )
    await engine.start()
    try:
        await engine.generate([GenerationRequest(str(i), prompt="p") for i in range(4)])
    finally:
        await engine.close()
    assert engine.stats() == EngineStats(generation_tokens=8, prompt_tokens=12, batches=1, running=0)
    assert reported(engine.stats()) == set(engine.stats_fields)


async def test_vllms_own_stat_lines_only_when_asked_and_until_closed() -> None:
    class FakeLLM:
        logged = 0

        async def do_log_stats(self) -> None:
            self.logged += 1

        def shutdown(self) -> None:
            pass

    engine = VllmEngine("/models/m")
    assert engine.log_stats_interval_s is None  # not asked: no task prints them
    llm = engine.llm = FakeLLM()
    engine._log_task = asyncio.create_task(engine._log_stats(0.01))
    await asyncio.sleep(0.1)
    task = engine._log_task
    await engine.close()
    await asyncio.sleep(0)
    assert llm.logged >= 2 and task.cancelled()
