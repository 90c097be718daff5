"""Shard jobs finished "as a worker would" without a worker: outputs (staged for fenced jobs),
then a completion manifest with the job id and fingerprint a worker writes. For round tests that
need exact control over what each job produced (which copy, which attempt, what counts)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from airflow_batchinfer.layout import staged_output
from airflow_batchinfer.rounds import inferred_shard, job_spec
from airflow_batchinfer.rpc.fingerprint import fingerprint, pin_input
from airflow_batchinfer.rpc.models import JobKind
from airflow_batchinfer.run_config import RunConfig
from airflow_batchinfer.storage import JsonlFile, ShardDescriptor
from airflow_batchinfer.storage.location import StorageOptions
from airflow_batchinfer.worker.manifest import write_job_manifest

ENGINE = {"engine": "simulated", "model": "simulated", "approval_rate": 0.5}


def write_rows(uri: str, rows: Iterable[Mapping[str, Any]], so: StorageOptions | None = None) -> None:
    with JsonlFile(uri, storage_options=so).writer_sync() as w:
        for row in rows:
            w.write(row)


def finish_job(
    cfg: RunConfig,
    kind: JobKind,
    r: int,
    shard: ShardDescriptor,
    outputs: Mapping[str, Iterable[Mapping[str, Any]]],
    counts: Mapping[str, int],
    *,
    token: str | None = None,
    engine: Mapping[str, Any] = ENGINE,
    run_s: float = 1.0,
    so: StorageOptions | None = None,
) -> dict[str, Any]:
    """Finish ``kind`` for ``shard`` (the pending shard; a judge reads the inferred file): write
    ``outputs`` (name -> rows) where the worker would and the manifest. Returns the manifest."""
    src = inferred_shard(cfg, r, shard) if kind == "judge" else shard
    spec = job_spec(cfg, kind, r, src)
    info = JsonlFile(spec.input, storage_options=so).info()
    pinned = pin_input(spec, info)
    token = token or uuid.uuid4().hex
    committed: dict[str, str] = {}
    for name, rows in outputs.items():
        if "staging" in spec.outputs and name in ("approved", "rejected"):
            uri = committed[name] = staged_output(
                spec.outputs["staging"], spec.outputs["manifest"], token, name
            )
        else:
            uri = spec.outputs[name]
        write_rows(uri, rows, so)
    manifest: dict[str, Any] = {
        "job_id": pinned.job_id,
        "kind": kind,
        "state": "succeeded",
        "input": spec.input,
        "outputs": spec.outputs,
        "attempt": token,
        "counts": dict(counts),
        "tokens": {"prompt": 1, "completion": 1},
        "round": r,
        "fingerprint": fingerprint(pinned, engine, info),
        "engine": dict(engine),
        "worker": "w1",
        "timings": {"started_at": time.time(), "finished_at": time.time(), "run_s": run_s},
        "batcher": {},
    }
    if committed:
        manifest["committed"] = committed
    write_job_manifest(spec.outputs["manifest"], manifest, so)
    return manifest


def finish_shard(
    cfg: RunConfig,
    r: int,
    shard: ShardDescriptor,
    approve: set[str],
    *,
    token: str | None = None,
    so: StorageOptions | None = None,
) -> dict[str, Any]:
    """Infer then judge one shard: ids in ``approve`` approved, the rest rejected. Returns the judge's
    manifest."""
    rows = [{**row, "result": "x", "status": "ok"} for row in read_rows(shard["uri"], so)]
    finish_job(cfg, "infer", r, shard, {"inferred": rows}, {"ok": len(rows)}, so=so)
    return judge_shard(cfg, r, shard, approve, token=token, so=so)


def read_rows(uri: str, so: StorageOptions | None = None) -> list[dict[str, Any]]:
    return list(JsonlFile(uri, storage_options=so).iter_records())


def judge_shard(
    cfg: RunConfig,
    r: int,
    shard: ShardDescriptor,
    approve: set[str],
    *,
    token: str | None = None,
    so: StorageOptions | None = None,
) -> dict[str, Any]:
    rows = read_rows(inferred_shard(cfg, r, shard)["uri"], so)
    ok = [{**row, "status": "approved"} for row in rows if row["id"] in approve]
    bad = [
        {**row, "status": "rejected", "judgment": {"approved": False, "reason": "no"}}
        for row in rows
        if row["id"] not in approve
    ]
    return finish_job(
        cfg,
        "judge",
        r,
        shard,
        {"approved": ok, "rejected": bad},
        {"approved": len(ok), "rejected": len(bad)},
        token=token,
        so=so,
    )
