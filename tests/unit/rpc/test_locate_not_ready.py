"""Issue 22, item 9 (d), review B1: no second copy while a worker that takes no new jobs may still run
the job. On Kubernetes the readiness probe drops a slow or paused worker (1 s timeout, two failures)
and a draining pod (SIGTERM in a rollout, a scale-down, a spot eviction) is terminating while it
finishes its jobs for up to ``drain_timeout_s``. Both left the "ready" list, and locate took a worker
the pool did not list for gone at once, so a retry started a second copy whatever
``unreachable_grace_s`` said; a fresh client (an Airflow retry) never asked them at all.

Discovery now gives two sets (:class:`Workers`): ``submit`` (ready, not terminating) and ``may_run``
(every pod that exists, has not ended and has an IP). Injected transports and a fake discovery stand
in for the workers and the API; the pod → sets mapping is the manager's, over fake pod objects."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_batchinfer.exceptions import WorkerUnavailable
from airflow_batchinfer.rpc.locate import Workers
from airflow_batchinfer.rpc.pool import PoolClient
from tests.support.locate import SPEC, A, B, workers

pytestmark = pytest.mark.chaos


def discovery(*found: Workers) -> Any:
    """What the pool lists at each refresh (the last one from then on)."""
    listed = list(found)

    async def discover() -> Workers:
        return listed.pop(0) if len(listed) > 1 else listed[0]

    return discover


async def test_a_paused_worker_the_probe_drops_still_holds_the_copy() -> None:
    """A (paused: its asks time out) leaves ``submit`` but stays in ``may_run``: nothing starts on B
    (before: unlisted, so taken for gone at the next refresh, and the job started on B)."""
    transport, submitted = workers({A}, {})
    discover = discovery(Workers.of([A, B]), Workers(submit=(B,), may_run=(A, B)))
    pool = PoolClient([], token="t", transport=transport, discover=discover, poll_interval_s=0.05,
                      unreachable_grace_s=60)  # fmt: skip
    with pytest.raises(WorkerUnavailable, match=r"http://a:1 .*may still run it"):
        await pool.submit_when_free(SPEC, deadline=time.monotonic() + 0.5)
    assert submitted == []
    assert list(pool.clients) == [B]  # new jobs still go only to ready workers
    await pool.aclose()


async def test_a_worker_whose_pod_is_gone_from_both_sets_is_gone() -> None:
    transport, submitted = workers({A}, {})
    discover = discovery(Workers.of([A, B]), Workers.of([B]))
    pool = PoolClient([], token="t", transport=transport, discover=discover, poll_interval_s=0.05,
                      unreachable_grace_s=60)  # fmt: skip
    url, _ = await pool.submit_when_free(SPEC, deadline=time.monotonic() + 5)
    assert url == B and submitted == [B]
    await pool.aclose()


class DrainingPool:
    """A pool whose worker A is draining (terminating): it runs the job but takes no new ones."""

    backend = "fake"

    def endpoints(self, lease_id: str | None = None) -> list[str]:
        return [B]

    def workers(self, lease_id: str | None = None) -> Workers:
        return Workers(submit=(B,), may_run=(A, B))

    def token(self) -> str:
        return "t"


async def test_a_fresh_client_follows_the_job_a_draining_worker_still_runs() -> None:
    """An Airflow retry's new client asks A too, and follows the job there (before: it knew only the
    ready workers, found nothing and started a second copy on B)."""
    transport, submitted = workers(set(), {A: "running"})
    pool = PoolClient.for_pool(DrainingPool(), transport=transport, poll_interval_s=0.05)  # type: ignore[arg-type]
    url, status = await pool.submit(SPEC)
    assert (url, status.state) == (A, "running") and submitted == []
    await pool.aclose()


def pod(
    name: str, ip: str | None, phase: str = "Running", *, ready: bool = True, deleting: bool = False
) -> Any:
    condition = SimpleNamespace(type="Ready", status="True" if ready else "False")
    return SimpleNamespace(
        metadata=SimpleNamespace(name=name, deletion_timestamp="2026-01-01T00:00:00Z" if deleting else None),
        status=SimpleNamespace(phase=phase, pod_ip=ip, conditions=[condition]),
    )


def test_kubernetes_discovery_lists_every_pod_that_may_still_run_a_job() -> None:
    pytest.importorskip("kubernetes", reason="needs the kubernetes extra")
    from kubernetes import client

    from airflow_batchinfer.pools.kubernetes import KubernetesPool

    pods = [
        pod("ready", "10.0.0.1"),
        pod("probe-failing", "10.0.0.2", ready=False),  # slow or paused: the probe dropped it
        pod("draining", "10.0.0.3", deleting=True),  # SIGTERM: finishing its jobs
        pod("done", "10.0.0.4", "Succeeded", ready=False),
        pod("crashed", "10.0.0.5", "Failed", ready=False),
        pod("scheduling", None, "Pending", ready=False),  # no IP: never took a job
    ]
    pool = KubernetesPool(client.ApiClient(), "p", "ns")
    pool._pods = lambda dep=None: (pods, 8000)  # type: ignore[method-assign]
    url = "http://10.0.0.{}:8000".format
    assert pool.workers() == Workers(submit=(url(1),), may_run=(url(1), url(2), url(3)))
    assert pool.endpoints() == [url(1)]  # readiness checks and submits see only the ready one
