"""Shard jobs finished "as a worker would" without a worker: outputs (staged for fenced jobs),
then a completion manifest (:class:`~airflow_batchinfer.state.docs.JobManifest`, the model the worker
writes) with the job id, fingerprint, id digests and reason groups a worker writes. For round tests
that need exact control over what each job produced (which copy, which attempt, what counts)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from airflow_batchinfer.judges.reasons import ReasonGroups, row_reason
from airflow_batchinfer.rpc.fingerprint import fingerprint, pin_input
from airflow_batchinfer.rpc.models import JobKind
from airflow_batchinfer.run.close import close_round
from airflow_batchinfer.run.jobs import job_spec, judge_input, round_kinds
from airflow_batchinfer.run.plan import propose_slot
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import (
    BatcherDelta,
    Digest,
    EngineTelemetry,
    GaugeSpan,
    JobManifest,
    Plan,
    Timings,
    write_job_manifest,
    write_plan,
)
from airflow_batchinfer.state.layout import RunLayout, fenced_outputs, staged_output
from airflow_batchinfer.state.shards import PlannedShard
from airflow_batchinfer.state.tally import Generated, Outcomes, Tally
from airflow_batchinfer.storage import JsonlFile, shard_dataset
from airflow_batchinfer.storage.digest import IdDigest
from airflow_batchinfer.storage.location import StorageOptions
from airflow_batchinfer.storage.shard_ref import RangeRef, ShardRef

ENGINE = {"engine": "simulated", "model": "simulated", "approval_rate": 0.5}


IDS = [f"r{i:02d}" for i in range(30)]


def make_run(tmp_path: Path, **settings: Any) -> RunConfig:
    """A run of ``IDS`` sharded into three shards of 10, judged by an LLM judge (on the run's pool,
    fused with inference, unless ``judge_pool`` gives it its own)."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": i, "question": f"q {i}"}) + "\n" for i in IDS))
    cfg = RunConfig.of(
        input=str(data),
        run_root=str(tmp_path / "run"),
        prompt_template="{{ question }}",
        records_per_shard=10,
        **{"judge": {"type": "llm"}, **settings},
    )
    cfg = cfg.replace(
        id_field=shard_dataset(cfg.data.input, RunLayout(cfg.run_root).input, records_per_shard=10).id_field
    )
    return cfg


def plan_round(cfg: RunConfig, slot: str = "round-00") -> Plan:
    plan = propose_slot(cfg, slot).plan
    write_plan(RunLayout(cfg.run_root), plan)
    return plan


def close(cfg: RunConfig, plan: Plan) -> dict[str, Any]:
    summary = close_round(cfg, plan)
    assert summary is not None
    return summary


def write_rows(uri: str, rows: Iterable[Mapping[str, Any]], so: StorageOptions | None = None) -> None:
    with JsonlFile(uri, storage_options=so).writer_sync() as w:
        for row in rows:
            w.write(row)


def counted(*, ok: int = 0, **outcomes: int) -> Tally:
    """A job's tally of ``ok`` records generated and its rows by outcome (:class:`Outcomes`' fields)."""
    return Tally(generated=Generated(ok=ok), outcomes=Outcomes(**outcomes))


def finish_job(
    cfg: RunConfig,
    kind: JobKind,
    r: int,
    shard: ShardRef | RangeRef | PlannedShard,
    outputs: Mapping[str, Iterable[Mapping[str, Any]]],
    counts: Tally,
    *,
    token: str | None = None,
    engine: Mapping[str, Any] = ENGINE,
    run_s: float = 1.0,
    ids: Mapping[str, IdDigest | None] | None = None,
    engine_stats: EngineTelemetry | None = None,
    so: StorageOptions | None = None,
) -> JobManifest:
    """Finish ``kind`` for ``shard`` (the pending shard; a judge reads the inferred file): write
    ``outputs`` (name -> rows) where the worker would and the manifest. Returns the manifest.

    The manifest's ``ids`` digests the input file's ids and each output's rows, as a worker does;
    ``ids`` replaces some of them (``None`` leaves one out: close then reads that shard). A
    judging or in-place job's ``reason_groups`` count its rejected rows' reasons, as a worker does.
    ``engine_stats``: the engine's figures
    (by default those of a simulated engine that ran one batch)."""
    shard = PlannedShard.of(shard)
    src = judge_input(cfg, r, shard, so) if kind == "judge" else shard  # the infer attempt named now
    spec = job_spec(cfg, kind, r, src)
    info = JsonlFile(spec.input, storage_options=so).info()
    pinned = pin_input(spec, info)
    token = token or uuid.uuid4().hex
    committed: dict[str, str] = {}
    id_field = cfg.data.id_field or "id"
    digests = {"input": IdDigest.of(r.get(id_field) for r in read_rows(spec.input, so))}
    reasons = ReasonGroups()
    for name, rows in outputs.items():
        rows = list(rows)
        digests[name] = IdDigest.of(r.get(id_field) for r in rows)
        if name == "rejected":
            for row in rows:
                reasons.add(row_reason(row))
        if "staging" in spec.outputs and name in fenced_outputs(kind):
            uri = committed[name] = staged_output(
                spec.outputs["staging"], spec.outputs["manifest"], token, name
            )
        else:
            uri = spec.outputs[name]
        write_rows(uri, rows, so)
    manifest = JobManifest(
        job_id=pinned.job_id,
        kind=kind,
        state="succeeded",
        input=spec.input,
        outputs=spec.outputs,
        attempt=token,
        counts=counts,
        ids={k: Digest.of(d) for k, d in {**digests, **(ids or {})}.items() if d is not None},
        tokens={"prompt": 1, "completion": 1},
        round=r,
        sampling=spec.params.get("sampling"),
        fingerprint=fingerprint(pinned, engine, info),
        engine=dict(engine),
        worker="w1",
        timings=Timings(started_at=time.time(), finished_at=time.time(), run_s=run_s),
        batcher=BatcherDelta(),
        reason_groups=reasons.as_dict() if kind != "infer" else None,
        committed=committed or None,
        engine_stats=engine_stats or simulated_engine_stats(run_s),
    )
    write_job_manifest(spec.outputs["manifest"], manifest, so)
    return manifest


def simulated_engine_stats(run_s: float, *, started_at: float | None = None) -> EngineTelemetry:
    """What the simulated engine reports of a job that ran one batch of one request."""
    return EngineTelemetry(
        engine_id="fake",
        started_at=time.time() if started_at is None else started_at,
        seconds=run_s,
        samples=2,
        counters={"generation_tokens": 1, "prompt_tokens": 1, "batches": 1},
        at_start={"generation_tokens": 0, "prompt_tokens": 0, "batches": 0},
        gauges={"running": GaugeSpan(peak=1, mean=0.5)},
    )


def job_manifest(**fields: Any) -> JobManifest:
    """A completion manifest of a job that ran nowhere (unit tests of its readers): what a worker
    writes, with placeholders where ``fields`` says nothing."""
    placeholders: dict[str, Any] = {
        "job_id": "j",
        "kind": "infer",
        "state": "succeeded",
        "input": "in.jsonl",
        "outputs": {},
        "attempt": uuid.uuid4().hex,
        "counts": Tally(),
        "ids": {},
        "tokens": {},
        "round": 0,
        "sampling": None,
        "fingerprint": "f",
        "engine": dict(ENGINE),
        "worker": "w1",
        "timings": Timings(started_at=0.0, finished_at=0.0, run_s=0.0),
        "batcher": BatcherDelta(),
    }
    return JobManifest.model_validate({**placeholders, **fields})


def finish_shard(
    cfg: RunConfig,
    r: int,
    shard: ShardRef | RangeRef | PlannedShard,
    approve: set[str],
    *,
    token: str | None = None,
    so: StorageOptions | None = None,
) -> JobManifest:
    """Run one shard's round jobs (infer_judge, or infer then judge on the judge's pool): ids in
    ``approve`` approved, the rest rejected. Returns the accepted job's manifest."""
    if round_kinds(cfg, "rounds")[0] == "infer":
        rows = [{**row, "result": "x", "status": "ok"} for row in read_rows(shard.uri, so)]
        finish_job(cfg, "infer", r, shard, {"inferred": rows}, counted(ok=len(rows)), so=so)
    return judge_shard(cfg, r, shard, approve, token=token, so=so)


def read_rows(uri: str, so: StorageOptions | None = None) -> list[dict[str, Any]]:
    return list(JsonlFile(uri, storage_options=so).iter_records())


def judge_shard(
    cfg: RunConfig,
    r: int,
    shard: ShardRef | RangeRef | PlannedShard,
    approve: set[str],
    *,
    token: str | None = None,
    so: StorageOptions | None = None,
) -> JobManifest:
    """The round's accepting job for ``shard``: the judge (reading the inferred file) or the fused
    infer_judge (reading the pending shard)."""
    kind = round_kinds(cfg, "rounds")[-1]
    if kind == "judge":
        rows = read_rows(judge_input(cfg, r, PlannedShard.of(shard), so).uri, so)
    else:
        rows = [{**row, "result": "x", "status": "ok"} for row in read_rows(shard.uri, so)]
    ok = [{**row, "status": "approved"} for row in rows if row["id"] in approve]
    bad = [
        {**row, "status": "rejected", "judgment": {"approved": False, "reason": "no"}}
        for row in rows
        if row["id"] not in approve
    ]
    return finish_job(
        cfg,
        kind,
        r,
        shard,
        {"approved": ok, "rejected": bad},
        counted(approved=len(ok), rejected=len(bad)),
        token=token,
        so=so,
    )
