"""One job tracker for every caller: pure decisions, no I/O (``now`` is an argument).

``PoolClient.run`` (every job a lane runs, on the triggerer or in its task; ``batchinfer run``; the
pre-flight) feeds what it observes into these functions and acts on the answer, so a lost worker, a
draining worker or a finished job is handled the same way everywhere:

- :func:`next_action` decides from one poll whether to stop polling: wait, done (the worker reports
  success; whether the job is done is still :func:`after_event`'s to say), failed, or resubmit;
- :func:`event_for` turns a decision into the typed :class:`JobEvent` the follower acts on;
- :func:`after_event` decides what the task does with an event, given the completion manifest: the
  one place a job counts as done. ``PoolClient.run`` asks it before it returns.

The completion manifest in storage is the truth, never the worker's word alone: a job whose worker
vanished is finished if its manifest exists, a job reported ``succeeded`` is not without one, and a
job without one is resubmitted (same ``job_id``, so idempotent). Whether a manifest is current (its
job id and fingerprint) is the round's close's to check, not the tracker's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from airflow_batchinfer.exceptions import RpcError
from airflow_batchinfer.rpc.models import JobState, JobStatus
from airflow_batchinfer.state.tally import Tally

if TYPE_CHECKING:
    from airflow_batchinfer.state.docs import JobManifest

Action = Literal["wait", "done", "failed", "resubmit"]
EventState = Literal["succeeded", "failed", "cancelled", "lost", "timeout"]
Outcome = Literal["done", "resubmit", "fail"]


@dataclass(frozen=True)
class Observation:
    """What one poll saw: a status, a worker that does not know the job, or no answer at all."""

    seen: Literal["status", "not_found", "unreachable"]
    state: JobState | None = None
    retryable: bool = False  # cancelled by a draining worker: not a failure of the job
    error: str | None = None
    counts: Tally = field(default_factory=Tally)

    @classmethod
    def of(cls, status: JobStatus) -> Observation:
        return cls("status", status.state, status.retryable, error=status.error, counts=status.counts)


def next_action(obs: Observation, *, lost_since: float | None, now: float, grace_s: float) -> Action:
    """``lost_since``: when the worker first stopped answering (``None`` if it answers)."""
    if obs.seen == "status":
        if obs.state == "succeeded":
            return "done"
        if obs.state == "cancelled" and obs.retryable:  # the worker is shutting down: run it elsewhere
            return "resubmit"
        if obs.state in ("failed", "cancelled"):
            return "failed"
        return "wait"
    # No answer about the job: whether it finished anyway is the manifest's to say (after_event).
    if obs.seen == "not_found":  # the worker restarted: the job is gone with it
        return "resubmit"
    # Unreachable: a blip or a dead worker. Resubmit only once it has been gone for a while, so a
    # network hiccup does not run the job twice.
    return "resubmit" if lost_since is not None and now - lost_since >= grace_s else "wait"


@dataclass(frozen=True)
class JobEvent:
    """How a tracked job ended, as :func:`~airflow_batchinfer.rpc.pool.follow` reports it."""

    state: EventState
    job_id: str
    url: str
    error: str | None = None  # the worker's reason, or why the job counts as lost
    counts: Tally = field(default_factory=Tally)


def event_for(
    action: Action, obs: Observation, *, job_id: str, url: str, lost_for_s: float = 0.0
) -> JobEvent:
    """The event for a decision other than ``wait``."""
    if action == "done":
        return JobEvent("succeeded", job_id, url, counts=obs.counts)
    if action == "failed":
        state: EventState = "cancelled" if obs.state == "cancelled" else "failed"
        return JobEvent(state, job_id, url, error=obs.error, counts=obs.counts)
    if action == "resubmit":
        if obs.seen == "status":
            why = f"{url} is draining and gave the job up"
        elif obs.seen == "not_found":
            why = f"{url} no longer knows the job (the worker restarted)"
        else:
            why = f"{url} unreachable for {lost_for_s:.0f} s"
        return JobEvent("lost", job_id, url, error=why)
    raise RpcError(f"no event for {action!r}")


def after_event(
    event: JobEvent, *, manifest: JobManifest | None, resubmits: int, max_resubmits: int
) -> Outcome:
    """What a task does with its trigger's event; the completion manifest (``manifest``: its read,
    ``None`` when there is none) decides, not the worker's report. A lost job whose manifest exists
    finished before its worker went away. A job without one (lost, or reported succeeded while its
    manifest has since been removed) is resubmitted, up to ``max_resubmits`` times in one try."""
    if event.state in ("succeeded", "lost"):
        # Present means done (a worker writes one only for a job that succeeded), whichever job id
        # it records: the round's close checks every manifest's job id and fingerprint against the
        # round's current settings (run.settle) and reruns or quarantines a stale one there. A
        # worker forgets a succeeded job only once its manifest is gone, so resubmitting here for
        # another job's manifest would get "succeeded" again without a run, until max_resubmits.
        if manifest is not None:
            return "done"
        return "fail" if resubmits >= max_resubmits else "resubmit"
    return "fail"
