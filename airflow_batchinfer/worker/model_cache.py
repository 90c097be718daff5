"""Where a worker loads its model from: a node-local cache of pre-staged models (``model_cache_dir``,
a Kubernetes pool's ``model_cache`` volume) when it holds a complete copy, else ``model`` itself.

A cold start from a local disk skips the network volume or the image layer the model otherwise
comes from; the worker says which it used (its announcement and ``/v1/stats``: ``model_source``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

ModelSource = Literal["cache", "model"]


def cached_model(model: str | None, cache_dir: str | None) -> tuple[str | None, ModelSource]:
    """The model path to load and where it is: ``<cache_dir>/<model's directory name>`` when that
    holds ``config.json`` (a copy still being staged has none yet), else ``model``."""
    if not model or not cache_dir:
        return model, "model"
    name = Path(model.rstrip("/")).name
    copy = Path(cache_dir) / name
    if name and (copy / "config.json").is_file():
        return str(copy), "cache"
    return model, "model"
