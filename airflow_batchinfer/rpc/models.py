"""Wire messages of the worker RPC (JSON only; shared by server and client)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from airflow_batchinfer.state.docs.jobs import TERMINAL_STATES, JobKind, JobState
from airflow_batchinfer.state.tally import Tally

__all__ = [
    "TERMINAL_STATES",
    "JobKind",
    "JobSpec",
    "JobState",
    "JobStatus",
    "Progress",
    "SleepAnswer",
    "SleepRequest",
    "WorkerStats",
]
# ``GET /v1/jobs/{id}?wait_s=`` answers when the job ends, or after at most this long (a long poll).
MAX_WAIT_S = 30.0

# Output names each job kind requires (all are URIs; "manifest" is the completion manifest).
REQUIRED_OUTPUTS: dict[str, tuple[str, ...]] = {
    "infer": ("inferred", "manifest"),
    "judge": ("approved", "rejected", "manifest"),
    "infer_judge": ("approved", "rejected", "manifest"),
    "in_place": ("approved", "rejected", "checkpoints", "manifest"),
}


class JobSpec(BaseModel):
    """``POST /v1/jobs``: one shard job, by reference. Submitting the same ``job_id`` again returns
    the existing job instead of running it twice."""

    model_config = ConfigDict(extra="forbid")

    job_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/=+\-]{0,255}$")
    kind: JobKind
    input: str = Field(min_length=1)
    outputs: dict[str, str]
    params: dict[str, Any] = Field(default_factory=dict)


class Progress(BaseModel):
    done: int = 0
    total: int | None = None


class JobStatus(BaseModel):
    job_id: str
    kind: JobKind
    state: JobState
    counts: Tally = Field(default_factory=Tally)  # what the job counted so far (its manifest's, once done)
    progress: Progress = Field(default_factory=Progress)
    error: str | None = None
    # True when the worker gave the job up for its own reasons (it is draining): the job did not
    # fail, so a client resubmits it elsewhere instead of counting a failure.
    retryable: bool = False
    manifest: str | None = None
    worker: str | None = None
    started_at: float | None = None
    finished_at: float | None = None


class WorkerStats(BaseModel):
    engine: dict[str, Any]
    slots_total: int
    slots_busy: int
    draining: bool
    jobs: dict[str, int]
    batcher: dict[str, Any]
    # where the engine loaded its model from ("cache": the node-local model cache, or "model"), and
    # the process's start-up marks (worker.announce: mark → Unix time), which a pool's starts() reads
    model_source: str | None = None
    started: dict[str, float] = Field(default_factory=dict)
    # the engine sleeps (POST /v1/sleep): its device is freed until the next job or POST /v1/wake
    sleeping: bool = False
    # why the engine cannot sleep at level 1 (the remedy with it); None: it can
    sleep_refusal: str | None = None


class SleepRequest(BaseModel):
    """``POST /v1/sleep``: free the device at ``level`` (1: the weights kept in CPU memory, 2: dropped)
    once the worker has been idle ``after_s`` seconds."""

    model_config = ConfigDict(extra="forbid")

    level: Literal[1, 2] = 1
    after_s: float = Field(default=0.0, ge=0.0)


class SleepAnswer(BaseModel):
    """What ``POST /v1/sleep`` did: ``sleeping`` now, or ``pending`` (waiting for the worker to idle)."""

    level: int
    after_s: float
    sleeping: bool
    pending: bool
