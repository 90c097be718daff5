"""A run's GPU-seconds, accounted from its usage events
(:mod:`airflow_batchinfer.state.docs.usage`) and its rounds' spans by
:func:`airflow_batchinfer.run.usage.account_usage`: :class:`UsageAccount`, carried by the run
report's ``usage`` and by each round summary's ``usage`` (the run up to that round's close).

Every figure is in GPU-seconds (replicas × GPUs per replica × seconds) but ``rewarm_s`` and the
starts' marks (seconds). ``leased`` = ``busy`` + ``idle_gates`` + ``idle_tails`` + ``idle_other``
(setup, warm-ups, between rounds). A run without usage events (one from before they were
recorded) has ``known`` false, its ``note`` says why, and its figures are ``None``, never zeros."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from airflow_batchinfer.state.docs.usage import WorkerStart

USAGE_ACCOUNT_VERSION: Literal[1] = 1  # of this part (summary.json's and report.json's ``usage``)


class RoundUsage(BaseModel):
    """One round's share: ``started_at`` → ``ended_at`` (its jobs' first start and last end),
    what the lease held then, the engines' busy time (``busy_s``: worker-seconds, the batcher's,
    each worker's capped at the span) and the rest, its tail idle."""

    model_config = ConfigDict(extra="forbid")
    slot: str
    round: int
    started_at: float
    ended_at: float
    busy_s: float
    leased_gpu_s: float
    busy_gpu_s: float
    busy_fraction: float | None  # busy ÷ leased (None: nothing leased in the span)
    idle_tail_gpu_s: float


class GateUsage(BaseModel):
    """One review gate's wait: its ``policy`` (``gate_idle``), ``opened_at`` → ``answered_at``
    (``None``: still waiting at the account's ``until``), what the lease held during it and what
    ``keep`` would have (the replicas held when it opened, for the whole wait)."""

    model_config = ConfigDict(extra="forbid")
    slot: str | None
    policy: str | None
    opened_at: float
    answered_at: float | None
    wait_s: float
    leased_gpu_s: float
    keep_gpu_s: float


class WarmUsage(BaseModel):
    """A pool (re)start the run waited for: requested → ready, with each worker's marks."""

    model_config = ConfigDict(extra="forbid")
    pool: str
    slot: str | None
    requested_at: float
    ready_at: float
    seconds: float
    workers: tuple[WorkerStart, ...] = ()


class UsageAccount(BaseModel):
    """A run's GPU-seconds up to ``until`` (see the module doc). ``open_lease``: the lease still
    held at ``until`` (no teardown's 0 yet: counted up to ``until``). ``keep_gpu_s``: what the run
    would have leased had every gate kept the replicas it held when it opened; ``saved_gpu_s``:
    that less ``leased_gpu_s``."""

    model_config = ConfigDict(extra="forbid")
    version: Literal[1] = USAGE_ACCOUNT_VERSION
    known: bool
    note: str = ""
    until: float | None = None
    open_lease: bool = False
    leased_gpu_s: float | None = None
    busy_gpu_s: float | None = None
    idle_gates_gpu_s: float | None = None
    idle_tails_gpu_s: float | None = None
    idle_other_gpu_s: float | None = None
    keep_gpu_s: float | None = None
    saved_gpu_s: float | None = None
    rewarm_s: float | None = None
    rounds: list[RoundUsage] = []
    gates: list[GateUsage] = []
    warms: list[WarmUsage] = []
