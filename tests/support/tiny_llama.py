"""The tiny random Llama, classifier and LoRA adapter for tests: :mod:`airflow_batchinfer.dev.tiny_llama`
(the benchmarks build theirs with it too)."""

from __future__ import annotations

from airflow_batchinfer.dev.tiny_llama import (
    build_tiny_classifier,
    build_tiny_embedder,
    build_tiny_llama,
    build_tiny_lora,
    build_tiny_thinker,
    build_tiny_tool_llama,
)

__all__ = [
    "build_tiny_classifier",
    "build_tiny_embedder",
    "build_tiny_llama",
    "build_tiny_lora",
    "build_tiny_thinker",
    "build_tiny_tool_llama",
]
