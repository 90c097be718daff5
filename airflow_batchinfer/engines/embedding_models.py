"""Embedding models for the ``transformers`` engine: which model directories are ones, how their
token states are pooled into a vector, and a batch's vectors.

A directory is an embedding model when it is a sentence-transformers model (``modules.json``), or when
its architectures are bare encoders or decoders (``BertModel``, ``LlamaModel``: no task head). Its
pooling is its sentence-transformers ``Pooling`` module's (``1_Pooling/config.json``: mean, CLS or
last token), else the mean over the text's tokens; the vector is L2-normalized, as vLLM's
``/v1/embeddings`` answers by default. torch is imported by the functions that need it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from airflow_batchinfer.engines.pooling import EmbedResult, shaped
from airflow_batchinfer.exceptions import ConfigError

POOLING_MODES = ("mean", "cls", "last")
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


def pooling_mode(path: str) -> str:
    """The pooling of the model at ``path``: its sentence-transformers Pooling module's, else mean."""
    pooling = _pooling_dir(path)
    if pooling is None:
        return "mean"
    with open(os.path.join(pooling, "config.json")) as f:
        config = json.load(f)
    for key, mode in _ST_MODES.items():
        if config.get(key):
            return mode
    asked = sorted(k for k, v in config.items() if v is True)
    raise ConfigError(
        f"transformers: {pooling}/config.json asks for a pooling this engine does not do ({asked}): it "
        f"pools by {', '.join(POOLING_MODES)}; give the model one of those"
    )


def _pooling_dir(path: str) -> str | None:
    modules = os.path.join(path, "modules.json")
    if not os.path.exists(modules):
        return None
    with open(modules) as f:
        for module in json.load(f):
            if str(module.get("type", "")).endswith("Pooling"):
                return os.path.join(path, str(module.get("path", "")))
    return None


def embed_batch(
    model: Any, tokenizer: Any, texts: list[str], mode: str, dimensions: Sequence[int | None], device: str
) -> list[EmbedResult]:
    """Each text's vector (right-padded batch; the padding is masked out of the pooling)."""
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
        EmbedResult(shaped(vector, dims), prompt_tokens=int(n))
        for vector, dims, n in zip(pooled.cpu().tolist(), dimensions, lengths.tolist(), strict=True)
    ]
