"""Embedding models for the ``transformers`` engine: which model directories are ones, how their
token states are pooled into a vector, and a batch's vectors.

A directory is an embedding model when it is a sentence-transformers model (``modules.json``), or when
its architectures are bare encoders or decoders (``BertModel``, ``LlamaModel``: no task head). Its
pooling is its sentence-transformers ``Pooling`` module's (``1_Pooling/config.json``: mean, CLS or
last token), L2-normalized when a ``Normalize`` module follows; without those modules the mean over
the text's tokens, normalized: as vLLM reads the same directory (so both engines answer the same
vector). torch is imported by the functions that need it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from airflow_batchinfer.engines.pooling import EmbedResult, shaped
from airflow_batchinfer.exceptions import ConfigError

POOLING_MODES = ("mean", "cls", "last")
_NAMED_MODES = {"mean": "mean", "cls": "cls", "lasttoken": "last"}
_ST_MODES = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "last",
}


def is_embedding_model(path: str, architectures: Sequence[str] | None) -> bool:
    """Whether the model at ``path`` (of ``architectures``, its config's) is an embedding model."""
    if os.path.exists(os.path.join(path, "modules.json")):
        return True
    names = list(architectures or ())
    return bool(names) and all(a.endswith("Model") and "For" not in a for a in names)


def pooling_of(path: str) -> tuple[str, bool]:
    """How the model at ``path`` pools, and whether it normalizes, as vLLM reads it: a
    sentence-transformers Pooling module's mode, normalized when a Normalize module follows; without
    one, the mean, normalized (vLLM's embed default)."""
    modules = _modules(path)
    pooling = next((m for m in modules if str(m.get("type", "")).endswith("Pooling")), None)
    if pooling is None:
        return "mean", True
    normalize = any(str(m.get("type", "")).endswith("Normalize") for m in modules)
    where = os.path.join(path, str(pooling.get("path", "")), "config.json")
    with open(where) as f:
        config = json.load(f)
    for key, mode in _ST_MODES.items():
        if config.get(key):
            return mode, normalize
    named = _NAMED_MODES.get(str(config.get("pooling_mode")))  # newer configs name it instead
    if named is not None:
        return named, normalize
    asked = sorted(k for k, v in config.items() if v is True)
    raise ConfigError(
        f"transformers: {where} asks for a pooling this engine does not do ({asked}): it pools by "
        f"{', '.join(POOLING_MODES)}; give the model one of those"
    )


def _modules(path: str) -> list[dict[str, Any]]:
    """The model's sentence-transformers modules (``modules.json``; none: not such a model)."""
    modules = os.path.join(path, "modules.json")
    if not os.path.exists(modules):
        return []
    with open(modules) as f:
        return list(json.load(f))


def embed_batch(
    model: Any,
    tokenizer: Any,
    texts: list[str],
    pooling: tuple[str, bool],
    dimensions: Sequence[int | None],
    device: str,
) -> list[EmbedResult]:
    """Each text's vector, pooled and normalized as ``pooling`` says (:func:`pooling_of`): a
    right-padded batch, the padding masked out of the pooling."""
    mode, normalize = pooling
    import torch

    enc = tokenizer(texts, return_tensors="pt", padding=True).to(device)
    with torch.inference_mode():
        states = model(**enc).last_hidden_state.float()
    mask = enc["attention_mask"].unsqueeze(-1).float()
    lengths = enc["attention_mask"].sum(dim=1)
    if mode == "cls":
        pooled = states[:, 0]
    elif mode == "last":
        pooled = states[torch.arange(states.shape[0]), lengths - 1]
    else:
        pooled = (states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    return [
        EmbedResult(shaped(vector, dims, normalize=normalize), prompt_tokens=int(n))
        for vector, dims, n in zip(pooled.cpu().tolist(), dimensions, lengths.tolist(), strict=True)
    ]
