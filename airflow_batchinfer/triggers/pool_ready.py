"""``PoolReadyTrigger``: waits, on the triggerer, until a worker pool has ``replicas`` ready workers
(``/v1/ready``: model loaded, not draining) running the wanted spec.

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
from airflow_batchinfer.rpc.pool import ready_workers
from airflow_batchinfer.triggers import settle

if TYPE_CHECKING:
    from airflow_batchinfer.pools.ref import WorkerPool

Readiness = Literal["ready", "wait", "timeout"]


@dataclass(frozen=True)
class PoolObservation:
    """One look at a pool.

    :param ready: the workers that answered ``/v1/ready`` (of the lease's generation, for a local pool).
    :param spec_key: the spec the workers run, where the backend records it (a Kubernetes
        Deployment's spec hash); ``None``: not recorded (a local generation is its spec; an adopted
        Deployment carries none).
    :param current_ready: ready workers of the current template with none of an older one left (a
        Kubernetes rollout); ``None`` where the backend has no rollouts."""

    ready: tuple[str, ...] = ()
    spec_key: str | None = None
    current_ready: int | None = None


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
    ``wait``. Pure: the setup task's inline check and the trigger's polls both decide with it."""
    same_spec = spec_key is None or obs.spec_key is None or obs.spec_key == spec_key
    rolled_out = obs.current_ready is None or obs.current_ready >= replicas
    if len(obs.ready) >= replicas and same_spec and rolled_out:
        return "ready"
    if deadline is not None and now > deadline:
        return "timeout"
    return "wait"


async def observe_pool(
    pool: WorkerPool, token: str | None, lease_id: str | None = None, *, timeout_s: float = 5.0
) -> PoolObservation:
    """Look at ``pool`` once: its endpoints, which of them answer ready, and (Kubernetes) its rollout."""
    urls: Sequence[str] = await asyncio.to_thread(pool.endpoints, lease_id)
    ready = await ready_workers(urls, token, timeout_s=timeout_s) if urls else []
    rollout: dict[str, Any] = {}
    if callable(getattr(pool, "rollout", None)):
        rollout = await asyncio.to_thread(pool.rollout)  # type: ignore[attr-defined]
    return PoolObservation(
        ready=tuple(ready), spec_key=rollout.get("spec_key"), current_ready=rollout.get("current_ready")
    )


class PoolReadyTrigger(BaseTrigger):
    """:param lease_id: the run whose workers to wait for (a local pool may run several generations).
    :param spec_key: the spec the workers must run (a Kubernetes pool's spec hash), if known."""

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
    ) -> None:
        super().__init__()
        self.worker_pool = worker_pool
        self.replicas = replicas
        self.deadline = deadline
        self.poll_interval_s = poll_interval_s
        self.lease_id = lease_id
        self.not_before = not_before
        self.spec_key = spec_key

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "worker_pool": self.worker_pool,
                "replicas": self.replicas,
                "deadline": self.deadline,
                "poll_interval_s": self.poll_interval_s,
                "lease_id": self.lease_id,
                "not_before": self.not_before,
                "spec_key": self.spec_key,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        pool = await aopen_pool(self.worker_pool)
        token = await asyncio.to_thread(pool.token)
        while True:
            obs = await observe_pool(pool, token, self.lease_id)
            decision = pool_readiness(
                obs, self.replicas, spec_key=self.spec_key, now=time.time(), deadline=self.deadline
            )
            if decision != "wait":
                await settle(self.not_before)
                if decision == "ready":
                    yield TriggerEvent({"state": "ready", "urls": list(obs.ready)})
                else:
                    yield TriggerEvent({"state": "timeout", "ready": len(obs.ready), "urls": list(obs.ready)})
                return
            await asyncio.sleep(self.poll_interval_s)
