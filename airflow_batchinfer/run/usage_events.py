"""Recording the run's ``lease`` usage events (:mod:`airflow_batchinfer.state.docs.usage`) where the
setup, the teardown or ``batchinfer run`` change what its lease holds. Best effort: the accounting
is a report, so a failed write is logged and never fails the task that leased or released."""

from __future__ import annotations

import logging
import time

from airflow_batchinfer.state.docs.usage import UsageEvent, record_usage
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage.location import StorageOptions

log = logging.getLogger(__name__)


def record_event(run_root: str | None, event: UsageEvent, so: StorageOptions | None = None) -> str | None:
    """Store ``event`` under ``run_root``; returns its URI, ``None`` when there is no run root or the
    write failed (logged: the accounting then lacks it, the task goes on)."""
    if not run_root:  # a teardown whose run never pinned its root: nothing to account to
        return None
    try:
        return record_usage(RunLayout(run_root), event, so)
    except Exception as exc:  # the accounting is a report: never fail the task over it
        log.warning(
            "usage: could not record the %s event of %s under %s: %s", event.kind, event.pool, run_root, exc
        )
        return None


def record_lease(
    run_root: str | None,
    pool: str,
    replicas: int,
    gpus: float = 1.0,
    so: StorageOptions | None = None,
    at: float | None = None,
) -> str | None:
    """Record that the run's lease on ``pool`` holds ``replicas`` of ``gpus`` GPUs each from ``at``
    (now) on; returns the event's URI (``None``: see :func:`record_event`)."""
    event = UsageEvent(
        kind="lease", at=time.time() if at is None else at, pool=pool, replicas=replicas, gpus=gpus
    )
    return record_event(run_root, event, so)
