"""A shard job operator's ``execute_complete`` (no sockets, no Airflow services): the completion
manifest decides, through :func:`~airflow_batchinfer.rpc.tracking.after_event`, never the worker's
``succeeded`` alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("airflow", reason="needs the airflow extra")

from airflow.sdk.exceptions import AirflowException

from airflow_batchinfer.operators import shard_jobs
from airflow_batchinfer.operators.shard_jobs import InferJudgeShardOperator
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.rpc.tracking import JobEvent
from airflow_batchinfer.state.docs import write_job_manifest
from tests.support.fake_jobs import counted, job_manifest

URL = "http://w1:8000"
SHARD: dict[str, Any] = {"shard_id": "part-00000", "uri": "/data/part-00000.jsonl", "records": 3, "round": 0}


class Recorded:
    def __init__(self) -> None:
        self.resubmits: list[int] = []
        self.errors: list[str] = []


@pytest.fixture
def op(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[InferJudgeShardOperator, Recorded, JobSpec]:
    """The operator with its run's settings, its job and its resubmission stubbed out (they read
    storage and talk to the pool); what it resubmits and the errors it records are kept."""
    outputs = {"approved": "a", "rejected": "r", "manifest": str(tmp_path / "m.json")}
    spec = JobSpec(job_id="j", kind="infer_judge", input=SHARD["uri"], outputs=outputs)
    seen = Recorded()
    task = InferJudgeShardOperator(task_id="infer_judge", shard=SHARD, run_root=str(tmp_path),
                                   worker_pool="local://gpu", max_resubmits=2)  # fmt: skip
    monkeypatch.setattr(task, "_config", lambda context: None)
    monkeypatch.setattr(task, "_spec", lambda cfg: spec)

    def submit(context: Any, cfg: Any, spec: JobSpec, pool: Any, resubmits: int, **_: Any) -> None:
        seen.resubmits.append(resubmits)

    monkeypatch.setattr(task, "_submit", submit)
    monkeypatch.setattr(shard_jobs, "hold_pool", lambda *a, **k: None)
    monkeypatch.setattr(
        shard_jobs, "record_job_error", lambda cfg, r, sid, kind, error, so: seen.errors.append(error)
    )
    return task, seen, spec


def complete(task: InferJudgeShardOperator, event: JobEvent, resubmits: int = 0) -> Any:
    return task.execute_complete({}, event.to_dict(), url=URL, resubmits=resubmits)


def test_a_success_with_its_manifest_returns_the_manifests_counts(op: Any) -> None:
    task, seen, spec = op
    write_job_manifest(spec.outputs["manifest"], job_manifest(job_id="j", counts=counted(approved=3)))
    result = complete(task, JobEvent("succeeded", "j", URL, counts=counted(approved=99)))
    assert result == {
        "shard_id": "part-00000",
        "round": 0,
        "records": 3,
        "counts": {"outcomes": {"approved": 3}},
    }
    assert seen.resubmits == [] and seen.errors == []


def test_the_workers_success_alone_does_not_complete_the_task(op: Any) -> None:
    """Without a manifest (removed since): run the job again, then fail once resubmits run out."""
    task, seen, _ = op
    assert complete(task, JobEvent("succeeded", "j", URL)) is None
    assert seen.resubmits == [1]  # resubmitted under the same job id
    with pytest.raises(AirflowException, match="without a manifest 3 times"):
        complete(task, JobEvent("succeeded", "j", URL), resubmits=2)
    assert seen.resubmits == [1] and len(seen.errors) == 1  # the error kept next to the manifests


def test_another_jobs_manifest_completes_the_task_for_close_to_check(op: Any) -> None:
    """A pinned input changed or a gate was answered again: the worker still remembers the job as
    succeeded while a manifest is there, so resubmitting would only see that again; close checks the
    manifest's job id and fingerprint."""
    task, seen, spec = op
    write_job_manifest(spec.outputs["manifest"], job_manifest(job_id="earlier", counts=counted(approved=2)))
    assert complete(task, JobEvent("succeeded", "j", URL))["counts"] == {"outcomes": {"approved": 2}}
    assert seen.resubmits == [] and seen.errors == []


def test_a_lost_job_whose_manifest_exists_is_done(op: Any) -> None:
    task, seen, spec = op
    write_job_manifest(spec.outputs["manifest"], job_manifest(job_id="j", counts=counted(approved=1)))
    assert complete(task, JobEvent("lost", "j", URL, error="gone"))["counts"] == {"outcomes": {"approved": 1}}
    assert seen.resubmits == []


def test_a_failed_job_fails_the_task_whatever_storage_holds(op: Any) -> None:
    task, seen, spec = op
    write_job_manifest(spec.outputs["manifest"], job_manifest(job_id="j"))

    with pytest.raises(AirflowException, match="failed on http://w1:8000: bad template"):
        complete(task, JobEvent("failed", "j", URL, error="bad template"))
    assert seen.resubmits == [] and seen.errors == ["failed on http://w1:8000: bad template"]
