"""A local pool's cold starts: its workers load a pre-staged copy of the model from the model cache
when one is there, and ``starts(since)`` lists each worker started since then with its marks."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path

import pytest

from airflow_batchinfer.pools import LocalPool, LocalPoolSpec
from airflow_batchinfer.rpc.client import SyncWorkerClient
from airflow_batchinfer.worker.announce import read_announcement

pytestmark = pytest.mark.slow


def test_workers_load_the_cached_copy_when_complete_and_report_their_starts(tmp_path: Path) -> None:
    # The simulated engine never reads the model's files: what is tested is the worker's choice of
    # path (the engine is created with it: its description names it) and what it reports.
    model = tmp_path / "models" / "tiny-llama"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    cache = tmp_path / "node-cache"
    shutil.copytree(model, cache / "tiny-llama")
    pool = LocalPool("starts", state_dir=tmp_path / "pools")
    spec = LocalPoolSpec(
        engine="simulated", model=str(model), model_cache_dir=str(cache), replicas=2, idle_ttl_s=None,
        allowed_prefixes=(str(tmp_path),),
    )  # fmt: skip
    try:
        since = time.time()
        urls = pool.up(spec)
        for url in urls:
            with SyncWorkerClient(url, token=pool.token()) as client:
                stats = client.stats()
            assert stats.model_source == "cache" and stats.engine["model"] == str(cache / "tiny-llama")
            assert stats.started["imports"] <= stats.started["engine"]  # the start marks, as announced
        workers = json.loads(pool.state_file.read_text())["generations"][spec.key()]["workers"]
        assert all(
            getattr(read_announcement(w["announce"]), "model_source", None) == "cache" for w in workers
        )

        starts = pool.starts(since)
        assert sorted(s.worker for s in starts) == sorted(w["id"] for w in workers)
        for s in starts:
            marks = [s.scheduled_s, s.started_s, s.loaded_s, s.ready_s]
            assert None not in marks and marks == sorted(marks), s  # spawned → imports → loaded → ready
        assert pool.starts(time.time()) == []  # warm workers started before: no start since

        # a copy not complete yet (no config.json): the workers load the model itself
        (cache / "tiny-llama" / "config.json").unlink()
        since = time.time()
        (url, *_) = pool.up(dataclasses.replace(spec, replicas=1, model_cache_dir=str(cache) + "/"))
        with SyncWorkerClient(url, token=pool.token()) as client:
            stats = client.stats()
        assert stats.model_source == "model" and stats.engine["model"] == str(model)
        assert len(pool.starts(since)) == 1
    finally:
        pool.down()
