"""``PoolReadyTrigger``: waits, on the triggerer, until a worker pool has ``replicas`` ready workers
(``/v1/ready``: model loaded, not draining) running the wanted spec, or refuses a pool that cannot
work from here: a local pool whose state is on another host, or a static pool URL that several
workers answer (a Service or load balancer: a job's status would be asked of a worker that never saw
it, and the job resubmitted as lost).

The decision is :func:`pool_readiness`, a pure function of one :class:`PoolObservation`; the pool
setup task asks it once inline (a warm pool: no deferral) and this trigger asks it at every poll, so
the two never disagree about what "ready" means. :func:`observe_pool` makes the observation.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_batchinfer.hooks.pool import aopen_pool
from airflow_batchinfer.pools.local import LocalPool
from airflow_batchinfer.rpc.pool import ready_workers, worker_instances
from airflow_batchinfer.triggers import settle

if TYPE_CHECKING:
    from airflow_batchinfer.pools.ref import WorkerPool

Readiness = Literal["ready", "wait", "timeout", "refused"]
# Requests to each static pool URL, at once and each on its own connection: a round-robin balancer
# shows a second worker in two; a random one in four does with probability 7/8 for two workers, and
# pool_setup and every trigger poll look again.
SHARED_PROBES = 4


@dataclass(frozen=True)
class PoolObservation:
    """One look at a pool.

    :param ready: the workers that answered ``/v1/ready`` (of the lease's generation, for a local pool).
    :param spec_key: the spec the workers run, where the backend records it (a Kubernetes
        Deployment's spec hash); ``None``: not recorded (a local generation is its spec; an adopted
        Deployment carries none).
    :param current_ready: ready workers of the current template with none of an older one left (a
        Kubernetes rollout); ``None`` where the backend has no rollouts.
    :param shared: URLs (of a static pool) that more than one worker process answered.
    :param elsewhere: a local pool with no state on this host (started on another one, or never)."""

    ready: tuple[str, ...] = ()
    spec_key: str | None = None
    current_ready: int | None = None
    shared: tuple[str, ...] = ()
    elsewhere: bool = False


def pool_readiness(
    obs: PoolObservation,
    replicas: int,
    *,
    spec_key: str | None = None,
    now: float = 0.0,
    deadline: float | None = None,
) -> Readiness:
    """``ready`` when ``replicas`` workers answer ready and run ``spec_key`` (when both it and the
    observation name one) with no rollout under way; else ``timeout`` past ``deadline``, else
    ``wait``; ``refused`` whatever else when the pool cannot work from here (:func:`why_refused`).
    Pure: the setup task's inline check and the trigger's polls both decide with it."""
    if obs.shared or obs.elsewhere:
        return "refused"
    same_spec = spec_key is None or obs.spec_key is None or obs.spec_key == spec_key
    rolled_out = obs.current_ready is None or obs.current_ready >= replicas
    if len(obs.ready) >= replicas and same_spec and rolled_out:
        return "ready"
    if deadline is not None and now > deadline:
        return "timeout"
    return "wait"


def why_refused(obs: PoolObservation, pool: WorkerPool) -> str:
    """What a ``refused`` observation of ``pool`` means, and the remedy."""
    if obs.elsewhere and isinstance(pool, LocalPool):
        return str(pool.not_here())
    return (
        f"worker pool {pool}: {', '.join(obs.shared)} is answered by several workers (a Service or "
        "load balancer in front of them). A job's status lives on the worker that runs it, so "
        "asking another one would call it lost and run it twice. List each worker's own URL in "
        "the connection (a headless Service's pod addresses), or use a Kubernetes pool "
        "(kubernetes://NAMESPACE/NAME), which finds its pods itself."
    )


async def observe_pool(
    pool: WorkerPool, token: str | None, lease_id: str | None = None, *, timeout_s: float = 5.0
) -> PoolObservation:
    """Look at ``pool`` once: its endpoints, which of them answer ready, (Kubernetes) its rollout,
    (static) whether an endpoint is shared by several workers, (local) whether its state is here."""
    if isinstance(pool, LocalPool) and not await asyncio.to_thread(pool.has_state):
        return PoolObservation(elsewhere=True)
    urls: Sequence[str] = await asyncio.to_thread(pool.endpoints, lease_id)
    shared: tuple[str, ...] = ()
    if pool.backend == "static" and urls:
        seen = await worker_instances(urls, probes=SHARED_PROBES, timeout_s=timeout_s)
        shared = tuple(u for u in urls if len(seen[u]) > 1)
    ready = await ready_workers(urls, token, timeout_s=timeout_s) if urls else []
    rollout: dict[str, Any] = {}
    if callable(getattr(pool, "rollout", None)):
        rollout = await asyncio.to_thread(pool.rollout)  # type: ignore[attr-defined]
    return PoolObservation(
        ready=tuple(ready),
        spec_key=rollout.get("spec_key"),
        current_ready=rollout.get("current_ready"),
        shared=shared,
    )


class PoolReadyTrigger(BaseTrigger):
    """:param lease_id: the run whose workers to wait for (a local pool may run several generations).
    :param spec_key: the spec the workers must run (a Kubernetes pool's spec hash), if known.
    :param keep_s: a local pool's lease is kept at each poll, renewed for this long and its dead
        workers restarted (a gate's answer re-warming a released pool: a worker that was idling
        out as the answer came exits during the wait); ``None``: the pool is only observed."""

    def __init__(
        self,
        *,
        worker_pool: str,
        replicas: int,
        deadline: float,
        poll_interval_s: float = 2.0,
        lease_id: str | None = None,
        not_before: float | None = None,
        spec_key: str | None = None,
        keep_s: float | None = None,
    ) -> None:
        super().__init__()
        self.keep_s = keep_s
        self.worker_pool = worker_pool
        self.replicas = replicas
        self.deadline = deadline
        self.poll_interval_s = poll_interval_s
        self.lease_id = lease_id
        self.not_before = not_before
        self.spec_key = spec_key

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "airflow_batchinfer.triggers.pool_ready.PoolReadyTrigger",
            {
                "worker_pool": self.worker_pool,
                "replicas": self.replicas,
                "deadline": self.deadline,
                "poll_interval_s": self.poll_interval_s,
                "lease_id": self.lease_id,
                "not_before": self.not_before,
                "spec_key": self.spec_key,
                "keep_s": self.keep_s,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        pool = await aopen_pool(self.worker_pool)
        # a local pool's token is only on the host that started it (observe_pool then refuses)
        here = not isinstance(pool, LocalPool) or await asyncio.to_thread(pool.has_state)
        token = await asyncio.to_thread(pool.token) if here else None
        while True:
            if here and self.keep_s is not None and self.lease_id and isinstance(pool, LocalPool):
                await asyncio.to_thread(pool.keep, self.lease_id, ttl_s=self.keep_s)
            obs = await observe_pool(pool, token, self.lease_id)
            decision = pool_readiness(
                obs, self.replicas, spec_key=self.spec_key, now=time.time(), deadline=self.deadline
            )
            if decision != "wait":
                await settle(self.not_before)
                if decision == "ready":
                    yield TriggerEvent({"state": "ready", "urls": list(obs.ready)})
                elif decision == "refused":
                    yield TriggerEvent({"state": "refused", "reason": why_refused(obs, pool)})
                else:
                    yield TriggerEvent({"state": "timeout", "ready": len(obs.ready), "urls": list(obs.ready)})
                return
            await asyncio.sleep(self.poll_interval_s)
