"""A pool's worker starts as :class:`~airflow_batchinfer.state.docs.usage.WorkerStart` rows (what a
run's ``warm`` usage event carries): pure functions of what the backends observe, so each backend
only gathers its observations (``WorkerPool.starts``).

Every mark is in seconds from ``since`` (the moment the run asked for the workers), ``None`` where
not known yet or not on that backend:

- ``scheduled_s``: the worker got its place (a pod bound to a node; a local process spawned);
- ``started_s``: its process runs (the container's ``startedAt``; a local worker's imports done);
- ``loaded_s``: its engine has loaded the model (the worker's ``engine`` start-up mark);
- ``ready_s``: it takes jobs (the pod's ``Ready`` condition; a local worker's announcement).

Kubernetes times are whole seconds (RFC 3339): a mark a fraction of a second before ``since`` is 0.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from airflow_batchinfer.state.docs.usage import WorkerStart

WORKER_CONTAINER = "worker"  # objects.worker_deployment's container


def _from(since: float, at: float | None) -> float | None:
    return None if at is None else round(max(0.0, at - since), 3)


def unix_time(text: Any) -> float | None:
    """An RFC 3339 time of the Kubernetes API (``2026-12-07T20:31:05Z``) as Unix time (``None``:
    unset or unreadable)."""
    if isinstance(text, dt.datetime):
        return text.timestamp()
    if not isinstance(text, str) or not text:
        return None
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)).timestamp()


def _condition(pod: Mapping[str, Any], kind: str) -> float | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind and c.get("status") == "True":
            return unix_time(c.get("lastTransitionTime"))
    return None


def _container_started(pod: Mapping[str, Any]) -> float | None:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    ours = [s for s in statuses if s.get("name") == WORKER_CONTAINER] or statuses[:1]
    for s in ours:
        return unix_time(((s.get("state") or {}).get("running") or {}).get("startedAt"))
    return None


def pod_starts(
    pods: Iterable[Mapping[str, Any]], since: float, loaded: Mapping[str, float] | None = None
) -> list[WorkerStart]:
    """The starts of the pods created since ``since`` (pods as the API serves them, camelCase
    JSON), by creation time. ``loaded``: pod name → the Unix time its worker's engine loaded (its
    ``/v1/stats`` ``started["engine"]``), for the pods whose worker answered."""
    loaded = loaded or {}
    rows = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        created = unix_time(meta.get("creationTimestamp"))
        # whole seconds: a pod created in the second ``since`` falls in counts
        if created is None or created + 1 <= since:
            continue
        name = str(meta.get("name"))
        start = WorkerStart(
            worker=name,
            scheduled_s=_from(since, _condition(pod, "PodScheduled")),
            started_s=_from(since, _container_started(pod)),
            loaded_s=_from(since, loaded.get(name)),
            ready_s=_from(since, _condition(pod, "Ready")),
        )
        rows.append((created, name, start))
    return [start for *_, start in sorted(rows, key=lambda r: (r[0], r[1]))]


def local_starts(
    workers: Iterable[Mapping[str, Any]], since: float, startups: Mapping[str, Mapping[str, float]]
) -> list[WorkerStart]:
    """The starts of a local pool's workers spawned since ``since`` (its state's worker entries:
    ``id``, ``spawned_at``), by spawn time. ``startups``: worker id → the start-up marks of its
    announcement (:data:`~airflow_batchinfer.worker.announce.STARTUP_MARKS`), for those that
    announced."""
    rows = []
    for w in workers:
        spawned = w.get("spawned_at")
        if not isinstance(spawned, int | float) or spawned < since:
            continue  # started before the request (or by a release that did not note it)
        marks = startups.get(str(w["id"])) or {}
        start = WorkerStart(
            worker=str(w["id"]),
            scheduled_s=_from(since, float(spawned)),
            started_s=_from(since, marks.get("imports")),
            loaded_s=_from(since, marks.get("engine")),
            ready_s=_from(since, marks.get("announced")),
        )
        rows.append((float(spawned), start))
    return [start for _, start in sorted(rows, key=lambda r: r[0])]
