from __future__ import annotations

from typing import Any

import pytest

from airflow_batchinfer.exceptions import RpcError
from airflow_batchinfer.rpc.models import JobStatus
from airflow_batchinfer.rpc.tracking import JobEvent, Observation, after_event, event_for, next_action
from tests.support.fake_jobs import job_manifest


@pytest.mark.parametrize(
    ("obs", "lost_since", "now", "action"),
    [
        (Observation("status", "running"), None, 0, "wait"),
        (Observation("status", "queued"), None, 0, "wait"),
        (Observation("status", "succeeded"), None, 0, "done"),
        (Observation("status", "failed"), None, 0, "failed"),
        (Observation("status", "cancelled"), None, 0, "failed"),
        (Observation("status", "cancelled", retryable=True), None, 0, "resubmit"),  # a draining worker
        (Observation("not_found"), 0, 0, "resubmit"),
        (Observation("unreachable"), 0, 5, "wait"),  # a blip: don't run the job twice
        (Observation("unreachable"), 0, 30, "resubmit"),  # gone for longer than the grace period
    ],
)
def test_next_action(obs: Observation, lost_since: float | None, now: float, action: str) -> None:
    assert next_action(obs, lost_since=lost_since, now=now, grace_s=20) == action


def test_events_carry_the_decision() -> None:
    drained = Observation.of(
        JobStatus(job_id="j", kind="infer", state="cancelled", retryable=True, error="x")
    )
    event = event_for(
        next_action(drained, lost_since=None, now=0, grace_s=20), drained, job_id="j", url="http://w"
    )
    assert (event.state, "draining" in (event.error or "")) == ("lost", True)
    failed = Observation("status", "failed", error="bad template")
    assert event_for("failed", failed, job_id="j", url="u") == JobEvent(
        "failed", "j", "u", error="bad template"
    )
    assert event_for("resubmit", Observation("unreachable"), job_id="j", url="u", lost_for_s=31).error == (
        "u unreachable for 31 s"
    )
    with pytest.raises(RpcError, match="no event"):
        event_for("wait", failed, job_id="j", url="u")


MANIFEST = {"job_id": "j", "kind": "infer", "state": "succeeded", "counts": {"generated": {"ok": 3}}}


@pytest.mark.parametrize(
    ("state", "manifest", "resubmits", "outcome"),
    [
        ("succeeded", MANIFEST, 0, "done"),
        ("succeeded", None, 0, "resubmit"),  # its manifest was removed since: run it again
        ("succeeded", None, 5, "fail"),  # and again, too often within one try
        # another request's manifest: done here (the worker would answer "succeeded" again without a
        # run); the round's close checks its job id and fingerprint and quarantines it if stale
        ("succeeded", {**MANIFEST, "job_id": "earlier"}, 0, "done"),
        ("lost", MANIFEST, 0, "done"),  # it finished before its worker went away
        ("lost", MANIFEST, 5, "done"),  # finished: no resubmit needed, however many before
        ("lost", None, 0, "resubmit"),
        ("lost", {**MANIFEST, "job_id": "earlier"}, 0, "done"),
        ("lost", None, 5, "fail"),  # lost too often within one try
        ("failed", MANIFEST, 0, "fail"),  # the worker's failure stands, whatever storage holds
        ("cancelled", None, 0, "fail"),
        ("timeout", MANIFEST, 0, "fail"),
    ],
)
def test_after_event_the_manifest_decides(
    state: str, manifest: dict[str, Any] | None, resubmits: int, outcome: str
) -> None:
    event = JobEvent(state, "j", "u")  # type: ignore[arg-type]
    read = None if manifest is None else job_manifest(**manifest)
    assert after_event(event, manifest=read, resubmits=resubmits, max_resubmits=5) == outcome
