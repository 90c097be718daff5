"""Pure decisions for tracking a submitted job (no I/O; ``now`` is an argument).

The completion manifest in storage is the truth: a job whose worker vanished is finished if its
manifest exists, and resubmitted (same ``job_id``, so idempotent) if not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from airflow_batchinfer.rpc.models import JobState

Action = Literal["wait", "done", "failed", "resubmit"]


@dataclass(frozen=True)
class Observation:
    """What one poll saw: a status, a worker that does not know the job, or no answer at all."""

    seen: Literal["status", "not_found", "unreachable"]
    state: JobState | None = None
    manifest_found: bool = False


def next_action(obs: Observation, *, lost_since: float | None, now: float, grace_s: float) -> Action:
    """``lost_since``: when the worker first stopped answering (``None`` if it answers)."""
    if obs.seen == "status":
        if obs.state == "succeeded":
            return "done"
        if obs.state in ("failed", "cancelled"):
            return "failed"
        return "wait"
    if obs.manifest_found:
        return "done"
    if obs.seen == "not_found":  # the worker restarted: the job is gone with it
        return "resubmit"
    # Unreachable: a blip or a dead worker. Resubmit only once it has been gone for a while, so a
    # network hiccup does not run the job twice.
    return "resubmit" if lost_since is not None and now - lost_since >= grace_s else "wait"
