"""The jobs' completion manifests and close's accepted docs are one typed model each
(:class:`~airflow_batchinfer.state.docs.JobManifest`, :class:`~airflow_batchinfer.state.docs.AcceptedJob`
/ :class:`~airflow_batchinfer.state.docs.QuarantinedJob`): what the worker writes reads back as it was,
the tests' fake writes the keys the worker writes, and a document this version does not know (another
version, a field it has no name for) is refused, naming the file and the remedy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.exceptions import StorageError
from airflow_batchinfer.rpc.models import JobKind
from airflow_batchinfer.run.jobs import judge_input, record_job_error
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import (
    AcceptedJob,
    QuarantinedJob,
    read_accepted,
    read_job_error,
    read_job_manifest,
    write_job_manifest,
)
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage.shard_ref import ShardRef
from tests.support.fake_jobs import (
    close,
    counted,
    finish_job,
    finish_shard,
    job_manifest,
    make_run,
    plan_round,
    read_rows,
)
from tests.support.worker_jobs import run_jobs

NESTED = ("outputs", "ids", "timings", "batcher", "committed")  # sub-documents whose keys must match too


def stored(path: str) -> dict[str, Any]:
    return json.loads(Path(path).read_text())  # type: ignore[no-any-return]


def shape(doc: dict[str, Any]) -> dict[str, Any]:
    """A document's keys, and its sub-documents' keys."""
    return {k: sorted(v) if k in NESTED and isinstance(v, dict) else None for k, v in doc.items()}


def setup(base: Path, kind: JobKind) -> tuple[RunConfig, ShardRef, tuple[JobKind, ...]]:
    """A run whose round runs ``kind`` (after its infer job, for a judge); its first shard and the
    jobs to run for it."""
    settings: dict[str, Any] = {"sampling": {"temperature": 0.5}}
    if kind in ("infer", "judge"):
        settings["judge_pool"] = "local://judge"
    if kind == "in_place":
        settings.update(strategy="in_place", max_attempts=2)
    base.mkdir(exist_ok=True)
    cfg = make_run(base, **settings)
    plan = plan_round(cfg, "tail" if kind == "in_place" else "round-00")
    return cfg, plan.shards[0], ("infer", "judge") if kind == "judge" else (kind,)


def fake(cfg: RunConfig, kind: JobKind, shard: ShardRef) -> None:
    """``kind``'s job for ``shard`` finished by the tests' fake: half approved, half rejected."""
    if kind == "infer":
        rows = [{**r, "result": "x", "status": "ok"} for r in read_rows(shard.uri)]
        finish_job(cfg, "infer", 0, shard, {"inferred": rows}, counted(ok=len(rows)))
        return
    if kind in ("judge", "infer_judge"):
        finish_shard(cfg, 0, shard, {r["id"] for r in read_rows(shard.uri)[::2]})
        return
    rows = read_rows(shard.uri)
    ok = [{**r, "status": "approved"} for r in rows[::2]]
    out = [
        {**r, "status": "max_attempts", "judgment": {"approved": False, "reason": "no"}} for r in rows[1::2]
    ]
    finish_job(cfg, "in_place", 0, shard, {"approved": ok, "rejected": out},
               counted(approved=len(ok), max_attempts=len(out)))  # fmt: skip


@pytest.mark.parametrize("kind", ["infer", "judge", "infer_judge", "in_place"])
def test_the_fake_writes_the_manifest_the_worker_writes(tmp_path: Path, kind: JobKind) -> None:
    """A manifest the worker's own job code writes reads back through the model unchanged, and the
    fake's manifest for the same job has the same keys, sub-documents included: a field renamed in
    one of them fails here."""
    real_cfg, real_shard, kinds = setup(tmp_path / "real", kind)
    run_jobs(real_cfg, [(k, 0, real_shard) for k in kinds], approval_rate=0.5)
    real_uri = RunLayout(real_cfg.run_root).job_manifest(0, real_shard.shard_id, kind)
    real = read_job_manifest(real_uri)
    assert real is not None and real.kind == kind
    assert real.sampling == (None if kind == "judge" else {"temperature": 0.5})  # what it generated with
    assert json.loads(real.encode()) == stored(real_uri)  # written through the model, read back whole
    assert (real.reason_groups is None) == (kind == "infer")

    fake_cfg, fake_shard, _ = setup(tmp_path / "fake", kind)
    fake(fake_cfg, kind, fake_shard)
    fake_uri = RunLayout(fake_cfg.run_root).job_manifest(0, fake_shard.shard_id, kind)
    assert read_job_manifest(fake_uri) is not None
    assert shape(stored(fake_uri)) == shape(stored(real_uri))


def test_a_judge_reads_the_attempt_its_fake_infer_manifest_names(tmp_path: Path) -> None:
    cfg, shard, _ = setup(tmp_path, "judge")
    fake(cfg, "infer", shard)
    m = read_job_manifest(RunLayout(cfg.run_root).job_manifest(0, shard.shard_id, "infer"))
    assert m is not None and m.committed is not None
    assert judge_input(cfg, 0, shard).uri == m.committed["inferred"]


@pytest.mark.parametrize("field", ["ids", "attempt"])
def test_a_manifest_without_its_digests_or_attempt_is_refused(tmp_path: Path, field: str) -> None:
    uri = str(tmp_path / "jobs" / "part-00000.judge.json")
    write_job_manifest(uri, job_manifest(kind="judge", reason_groups={"no": 3}, committed={"approved": "a"}))
    Path(uri).write_text(json.dumps({k: v for k, v in stored(uri).items() if k != field}))
    with pytest.raises(StorageError, match=rf"{field}: Field required.*delete it to rerun the job"):
        read_job_manifest(uri)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"schema_version": 1}, "schema_version 1 is not supported"),  # counts as flat keys
        ({"schema_version": 3}, "schema_version 3 is not supported"),
        ({"counts": {"approved": 3}}, "counts.approved: Extra inputs are not permitted"),
        ({"surprise": 1}, "surprise: Extra inputs are not permitted"),  # written by a newer worker
        ({"job_id": None}, "job_id"),
        ({"ids": {"input": {"count": 1, "sum": "not hex"}}}, "ids.input.sum"),
    ],
)
def test_a_manifest_this_version_does_not_know_is_refused(
    tmp_path: Path, change: dict[str, Any], named: str
) -> None:
    uri = str(tmp_path / "part-00000.infer.json")
    write_job_manifest(uri, job_manifest())
    Path(uri).write_text(json.dumps({**stored(uri), **change}))
    with pytest.raises(StorageError, match=named) as refused:
        read_job_manifest(uri)
    assert uri in str(refused.value) and "delete it to rerun the job" in str(refused.value)


def test_accepted_and_quarantined_docs_read_back_as_close_wrote_them(tmp_path: Path) -> None:
    cfg = make_run(tmp_path)
    plan = plan_round(cfg)
    done, never = plan.shards[0], plan.shards[1]
    for s in plan.shards:
        if s is not never:
            finish_shard(cfg, 0, s, {r["id"] for r in read_rows(s.uri)[:3]})
    close(cfg, plan)
    layout = RunLayout(cfg.run_root)
    uri = layout.accepted(0, done.shard_id, "infer_judge")
    accepted = read_accepted(uri)
    assert isinstance(accepted, AcceptedJob) and json.loads(accepted.encode()) == stored(uri)
    assert accepted.counts == counted(approved=3, rejected=7) and accepted.manifest_attempt is None
    assert accepted.digest("approved") is not None and "manifest_attempt" not in stored(uri)
    uri = layout.accepted(0, never.shard_id, "infer_judge")
    quarantined = read_accepted(uri)
    assert isinstance(quarantined, QuarantinedJob) and json.loads(quarantined.encode()) == stored(uri)
    assert quarantined.sweep == "swept" and not quarantined.sweeping and quarantined.orphans_removed == []

    Path(uri).write_text(json.dumps({**stored(uri), "sweep": "halfway"}))
    with pytest.raises(StorageError, match="sweep") as refused:
        read_accepted(uri)
    assert uri in str(refused.value) and "delete it to redo that step" in str(refused.value)


def test_a_jobs_last_error_is_quoted_by_the_quarantine_and_an_unknown_note_refused(tmp_path: Path) -> None:
    cfg = make_run(tmp_path)
    plan = plan_round(cfg)
    sid = plan.shards[0].shard_id
    record_job_error(cfg, 0, sid, "infer_judge", "JobFailed: disk full", None)
    uri = RunLayout(cfg.run_root).job_error(0, sid, "infer_judge")
    note = read_job_error(uri)
    assert note is not None and (note.shard_id, note.kind, note.error) == (
        sid,
        "infer_judge",
        "JobFailed: disk full",
    )
    summary = close(cfg, plan)
    assert [f["error"] for f in summary["failed_shards"] if f["shard_id"] == sid] == ["JobFailed: disk full"]
    Path(uri).write_text(json.dumps({**stored(uri), "retries": 3}))
    with pytest.raises(StorageError, match="retries") as refused:
        read_job_error(uri)
    assert uri in str(refused.value)
