"""Where a worker loads its model from: the node-local cache's complete copy, else ``model``."""

from __future__ import annotations

from pathlib import Path

from airflow_batchinfer.worker.model_cache import cached_model


def test_a_complete_copy_in_the_cache_is_loaded_from_there(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "llama-8b").mkdir(parents=True)
    (cache / "llama-8b" / "config.json").write_text("{}")
    assert cached_model("/models/llama-8b", str(cache)) == (str(cache / "llama-8b"), "cache")
    assert cached_model("/models/llama-8b/", str(cache)) == (str(cache / "llama-8b"), "cache")


def test_otherwise_the_model_itself(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "staging").mkdir(parents=True)  # a copy still being staged: no config.json yet
    assert cached_model("/models/staging", str(cache)) == ("/models/staging", "model")
    assert cached_model("/models/other", str(cache)) == ("/models/other", "model")  # not staged
    assert cached_model("/models/other", None) == ("/models/other", "model")  # no cache
    assert cached_model("/models/other", str(tmp_path / "missing")) == ("/models/other", "model")
    assert cached_model(None, str(cache)) == (None, "model")  # an engine without a model
