"""A run's pool-usage events (``usage/``), from which its GPU-seconds are accounted: one small
write-once document per event, so the setup, the lanes, the gates and the teardown (in different
processes, on different hosts) never race on one file.

- ``lease``: the replicas this run's lease holds from ``at`` on (the setup's acquire, a lane that
  shrinks the run's demand with the tail, a round that takes them back, the teardown's 0);
- ``gate_open`` / ``gate_answered``: a review gate's wait, with its ``policy`` (``gate_idle``), the
  replicas the lease holds as it opens and, for a released gate, ``lease_ttl_s``: the lease lapses
  that long after the opening unless the answer comes first (the accounting's lease holds 0 from then);
- ``warm``: a pool (re)start the run waited for: ``requested_at`` → ``at`` (ready), with each
  worker's marks in ``workers`` (scheduled, started, model loaded, ready; seconds from the request).
"""

from __future__ import annotations

import secrets
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, TypeAdapter

from airflow_batchinfer.state.docs.io import DocModel, read_model
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage.files import names
from airflow_batchinfer.storage.json_doc import write_bytes
from airflow_batchinfer.storage.location import StorageOptions, join, resolve

UsageKind = Literal["lease", "gate_open", "gate_answered", "warm"]


class WorkerStart(BaseModel):
    """One worker's start, in seconds from the request (``None``: not known on this backend)."""

    model_config = ConfigDict(extra="forbid")
    worker: str
    scheduled_s: float | None = None
    started_s: float | None = None
    loaded_s: float | None = None
    ready_s: float | None = None


class UsageEvent(DocModel):
    """One event of the run's pool usage (see the module doc). ``at``: Unix time; ``pool``: the
    pool reference; ``gpus``: GPUs per replica (1 where the backend does not say)."""

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset({"slot", "policy", "requested_at", "lease_ttl_s"})

    kind: UsageKind
    at: float
    pool: str
    replicas: int = 0
    gpus: float = 1.0
    slot: str | None = None
    policy: str | None = None
    requested_at: float | None = None
    # gate_open of a released gate: the lease lapses this long after ``at`` unless the answer came first
    lease_ttl_s: float | None = None
    workers: tuple[WorkerStart, ...] = ()


_EVENT = TypeAdapter(UsageEvent)


def record_usage(layout: RunLayout, event: UsageEvent, so: StorageOptions | None = None) -> str:
    """Store ``event`` (its own object, named to sort by time); returns its URI."""
    uri = join(layout.usage, f"{event.at:017.6f}-{event.kind}-{secrets.token_hex(3)}.json")
    write_bytes(resolve(uri, so), event.encode())
    return uri


def read_usage(layout: RunLayout, so: StorageOptions | None = None) -> list[UsageEvent]:
    """Every usage event of the run, by time (none for a run from before they were recorded)."""
    found = (
        read_model(_EVENT, join(layout.usage, n), "usage event", so)
        for n in sorted(names(layout.usage, so))
        if n.endswith(".json")
    )
    return sorted((e for e in found if e is not None), key=lambda e: e.at)
