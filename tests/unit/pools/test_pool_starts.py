"""A pool's worker starts from what its backend observes (pods, announcements), without a server."""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow_batchinfer.pools.starts import local_starts, pod_starts, unix_time
from airflow_batchinfer.pools.static import StaticPool
from airflow_batchinfer.state.docs.usage import UsageEvent, WorkerStart

SINCE = unix_time("2026-12-07T20:00:00Z")
assert SINCE is not None


def at(seconds: int) -> str:
    return (dt.datetime.fromtimestamp(SINCE, dt.UTC) + dt.timedelta(seconds=seconds)).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )


def pod(name: str, created: int, *, scheduled: int | None = None, started: int | None = None,
        ready: int | None = None) -> dict[str, Any]:  # fmt: skip
    conditions = [{"type": "Initialized", "status": "True", "lastTransitionTime": at(created)}]
    if scheduled is not None:
        conditions.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": at(scheduled)})
    conditions.append(
        {"type": "Ready", "status": "True" if ready is not None else "False",
         "lastTransitionTime": at(ready if ready is not None else created)}
    )  # fmt: skip
    status: dict[str, Any] = {"conditions": conditions}
    if started is not None:
        status["containerStatuses"] = [
            {"name": "sidecar", "state": {"running": {"startedAt": at(0)}}},
            {"name": "worker", "state": {"running": {"startedAt": at(started)}}},
        ]
    return {"metadata": {"name": name, "creationTimestamp": at(created)}, "status": status}


def test_pods_created_since_the_request_with_their_marks_in_seconds_from_it() -> None:
    pods = [
        pod("w-b", 2, scheduled=3, started=40, ready=95),
        pod("w-old", -600, scheduled=-599, started=-500, ready=-400),  # warm before: not a start
        pod("w-a", 1, scheduled=31),  # still pending a node: unscheduled marks are None
        pod("w-c", 2, scheduled=2, started=9),
    ]
    loaded = {"w-b": SINCE + 90.25, "w-old": SINCE - 450}
    assert pod_starts(pods, SINCE, loaded) == [
        WorkerStart(worker="w-a", scheduled_s=31.0),
        WorkerStart(worker="w-b", scheduled_s=3.0, started_s=40.0, loaded_s=90.25, ready_s=95.0),
        WorkerStart(worker="w-c", scheduled_s=2.0, started_s=9.0),  # not Ready: no ready_s
    ]


def test_a_pod_created_within_the_requests_second_counts_from_zero() -> None:
    since = SINCE + 0.6  # the API's times are whole seconds
    (start,) = pod_starts([pod("w", 0, scheduled=0, ready=1)], since)
    assert start == WorkerStart(worker="w", scheduled_s=0.0, ready_s=0.4)


def test_local_workers_spawned_since_the_request_from_their_announcements() -> None:
    workers = [
        {"id": "b", "spawned_at": SINCE + 0.5},
        {"id": "a", "spawned_at": SINCE + 0.2},
        {"id": "old", "spawned_at": SINCE - 30},
        {"id": "legacy"},  # a state file from before spawned_at: not known to be a start
    ]
    startups = {
        "a": {"imports": SINCE + 1.2, "app": SINCE + 1.3, "engine": SINCE + 4.0, "announced": SINCE + 4.1},
        "old": {"imports": SINCE - 29, "engine": SINCE - 20, "announced": SINCE - 19},
    }
    assert local_starts(workers, SINCE, startups) == [
        WorkerStart(worker="a", scheduled_s=0.2, started_s=1.2, loaded_s=4.0, ready_s=4.1),
        WorkerStart(worker="b", scheduled_s=0.5),  # still starting: not announced yet
    ]


def test_a_static_pool_starts_nothing_and_the_warm_event_carries_the_rows() -> None:
    assert StaticPool(["http://w:1"]).starts(SINCE) == []
    rows = pod_starts([pod("w", 1, scheduled=0, started=5, ready=20)], SINCE + 1)
    event = UsageEvent(kind="warm", at=SINCE + 20, pool="kubernetes://ns/p", requested_at=SINCE, workers=rows)
    assert event.workers == tuple(rows)
    assert event.to_json()["workers"] == [
        {"worker": "w", "scheduled_s": 0.0, "started_s": 4.0, "loaded_s": None, "ready_s": 19.0}
    ]


def test_unreadable_times_are_unknown() -> None:
    assert unix_time(None) is None and unix_time("") is None and unix_time("yesterday") is None
    assert unix_time("2026-12-07T20:00:00Z") == SINCE
