"""``WorkerJobTrigger`` without sockets (the job's end injected at ``follow``): a worker's
``succeeded`` ends the task on the triggerer only when the completion manifest says so too, as
:func:`~airflow_batchinfer.rpc.tracking.after_event` decides, and only without an ``aws_conn_id``
(the triggerer makes no connection lookup); anything else resumes the task."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("airflow", reason="needs the airflow extra")

from airflow.sdk import BaseHook
from airflow.triggers.base import TaskSuccessEvent, TriggerEvent

from airflow_batchinfer.rpc.tracking import JobEvent
from airflow_batchinfer.state.docs import write_job_manifest
from airflow_batchinfer.state.tally import Generated, Tally
from airflow_batchinfer.triggers import worker_job
from airflow_batchinfer.triggers.worker_job import WorkerJobTrigger
from tests.support.fake_jobs import job_manifest

URL = "http://w1:8000"
RESULT = {"shard_id": "part-00000", "round": 0, "records": 3, "counts": {}}


@pytest.fixture
def ends(monkeypatch: pytest.MonkeyPatch) -> list[JobEvent]:
    """The event ``follow`` returns next (set ``ends[0]``); the pool gives a token, no socket opens."""
    ending: list[JobEvent] = [JobEvent("succeeded", "j", URL, counts=Tally(generated=Generated(ok=2)))]

    async def pool(worker_pool: str) -> Any:
        return SimpleNamespace(token=lambda: "tok")

    async def follow(client: Any, job_id: str, **_: Any) -> JobEvent:
        return ending[0]

    monkeypatch.setattr(worker_job, "aopen_pool", pool)
    monkeypatch.setattr(worker_job, "follow", follow)
    return ending


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Airflow connection lookups (blocking ones break the triggerer on Airflow 3.1/3.2): recorded,
    and each fails."""
    seen: list[str] = []

    def lookup(*args: Any, **kwargs: Any) -> Any:
        seen.append(str(kwargs.get("aws_conn_id") or args[-1]))
        raise AssertionError("a connection lookup on the triggerer")

    monkeypatch.setattr(BaseHook, "get_connection", lookup)
    try:  # the amazon provider's hook, where the aws extra is installed
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
    except ImportError:
        return seen
    monkeypatch.setattr(AwsBaseHook, "__init__", lookup)
    return seen


def manifest_at(tmp_path: Path, **fields: Any) -> str:
    uri = str(tmp_path / "jobs" / "part-00000.infer.json")
    write_job_manifest(uri, job_manifest(**{"job_id": "j", "counts": {"generated": {"ok": 3}}, **fields}))

    return uri


async def end_of(trigger: WorkerJobTrigger) -> TriggerEvent | TaskSuccessEvent:
    events = [e async for e in WorkerJobTrigger(**trigger.serialize()[1]).run()]
    assert len(events) == 1  # one event, always
    return events[0]


# Another request's manifest too: done, as for the task (close checks its job id and fingerprint).
@pytest.mark.parametrize("job_id", ["j", "earlier"])
async def test_a_success_the_manifest_confirms_ends_the_task_with_its_counts(
    ends: list[JobEvent], lookups: list[str], tmp_path: Path, job_id: str
) -> None:
    trigger = WorkerJobTrigger(worker_pool="pool", url=URL, job_id="j", result=RESULT,
                               manifest=manifest_at(tmp_path, job_id=job_id))  # fmt: skip
    event = await end_of(trigger)
    assert isinstance(event, TaskSuccessEvent)
    assert event.xcoms == {"return_value": {**RESULT, "counts": {"generated": {"ok": 3}}}}  # the manifest's
    assert lookups == []  # read with plain fsspec (the environment's credentials)


async def test_with_an_aws_connection_a_success_resumes_the_task_without_a_lookup(
    ends: list[JobEvent], lookups: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The task reads the manifest with its connection and decides (``execute_complete``)."""
    reads: list[str] = []
    monkeypatch.setattr(worker_job, "read_job_manifest", lambda uri, *a: reads.append(uri))
    trigger = WorkerJobTrigger(worker_pool="pool", url=URL, job_id="j", result=RESULT,
                               manifest=manifest_at(tmp_path), aws_conn_id="aws_s3")  # fmt: skip
    event = await end_of(trigger)
    assert not isinstance(event, TaskSuccessEvent)
    assert JobEvent.from_dict(event.payload) == ends[0]  # resumed with the worker's report
    assert (lookups, reads) == ([], [])  # no connection looked up, no manifest read here


@pytest.mark.parametrize(
    "manifest",
    [
        "missing",  # removed since, or never written
        "unreadable",  # the task reads it again, and fails with the reason
        None,  # a trigger without a manifest to read (deferred by an earlier release)
    ],
)
async def test_the_workers_success_alone_does_not_end_the_task(
    ends: list[JobEvent], tmp_path: Path, manifest: Any
) -> None:
    uri = prepare(tmp_path, manifest)
    event = await end_of(
        WorkerJobTrigger(worker_pool="pool", url=URL, job_id="j", result=RESULT, manifest=uri)
    )
    assert not isinstance(event, TaskSuccessEvent)
    assert JobEvent.from_dict(event.payload) == ends[0]  # resumed with the worker's report: it decides


def prepare(tmp_path: Path, manifest: Any) -> str | None:
    """The manifest URI a trigger gets, with what ``manifest`` says lying there."""
    if manifest is None:
        return None
    path = tmp_path / "jobs" / "part-00000.infer.json"
    if manifest == "unreadable":
        path.parent.mkdir(parents=True)
        path.write_text("{not json")
    return str(path)


@pytest.mark.parametrize("state", ["failed", "cancelled", "lost", "timeout"])
async def test_every_other_end_resumes_the_task(ends: list[JobEvent], tmp_path: Path, state: str) -> None:
    ends[0] = JobEvent(state, "j", URL, error="why")  # type: ignore[arg-type]
    trigger = WorkerJobTrigger(worker_pool="pool", url=URL, job_id="j", result=RESULT,
                               manifest=manifest_at(tmp_path))  # fmt: skip
    event = await end_of(trigger)
    assert not isinstance(event, TaskSuccessEvent) and event.payload["state"] == state


async def test_without_a_result_a_success_resumes_the_task(ends: list[JobEvent], tmp_path: Path) -> None:
    event = await end_of(
        WorkerJobTrigger(worker_pool="pool", url=URL, job_id="j", manifest=manifest_at(tmp_path))
    )
    assert not isinstance(event, TaskSuccessEvent) and event.payload["state"] == "succeeded"
