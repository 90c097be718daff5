"""A round's tail gives replicas back: when a lane ends (no shard left for it), the run's demand on
its pool falls to what the lanes still running need (:func:`~airflow_batchinfer.pools.tail.tail_replicas`),
and the pool stops idle workers beyond it (never one with a running job). A round about to run takes
them back (:func:`take_back`).

The lane's driver calls :func:`shrink_tail` (on the triggerer, in the lane task, and in
``batchinfer run``); what it observes comes from the round's lane documents (shards not ended,
lanes not finished) and the workers' ``/v1/stats`` (per-worker slots, workers with a job). Each
change is logged ("replicas N -> M: K lanes left") and recorded as the run's ``lease`` usage event,
best effort: a failed write is logged, never fails the lane.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from airflow_batchinfer.exceptions import RpcError
from airflow_batchinfer.pools import WorkerPool
from airflow_batchinfer.pools.tail import tail_replicas
from airflow_batchinfer.rpc.pool import PoolClient
from airflow_batchinfer.run.usage_events import record_lease
from airflow_batchinfer.state.docs import Plan
from airflow_batchinfer.state.docs.lanes import LaneDoc, read_lanes
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage.location import StorageOptions

log = logging.getLogger("airflow_batchinfer.lanes")
Logger = logging.Logger | logging.LoggerAdapter[Any]


def round_left(plan: Plan, docs: list[LaneDoc], lanes: int) -> tuple[int, int]:
    """``(shards not ended, lanes not finished)`` of a round run by ``lanes`` lanes, from their
    documents (a lane without one yet is running; one of an earlier lane count is not this round's)."""
    ids = {s.shard_id for s in plan.shards}
    current = [d for d in docs if d.lanes == lanes]
    ended = {s.shard_id for d in current for s in d.shards if s.state in ("done", "failed")}
    return len(ids - ended), lanes - sum(d.finished for d in current)


async def worker_load(client: PoolClient) -> tuple[int, int, int]:
    """``(workers answering, workers running a job, slots per worker)`` from their ``/v1/stats``."""
    await client.refresh(force=True)
    answering = busy = concurrency = 0
    for worker in list(client.clients.values()):
        try:
            stats = await worker.stats()
        except RpcError:
            continue  # a worker that does not answer is not counted: the pool keeps it
        answering += 1
        busy += stats.slots_busy > 0
        concurrency = max(concurrency, stats.slots_total)
    return answering, busy, concurrency


async def shrink_tail(
    pool: WorkerPool,
    lease_id: str | None,
    client: PoolClient,
    plan: Plan,
    lanes: int,
    *,
    run_root: str,
    so: StorageOptions | None = None,
    logger: Logger = log,
) -> int | None:
    """After a lane of ``plan`` (run by ``lanes`` lanes) ended: lower ``lease_id``'s demand on
    ``pool`` to what the round still needs. Returns the replicas the pool targets, ``None`` when
    nothing changed (no lease, no worker answers, the round still needs them all, or the pool could
    not be asked: a lane that ended is not failed by its tail)."""
    if lease_id is None:
        return None
    try:
        return await _shrink(pool, lease_id, client, plan, lanes, run_root, so, logger)
    except Exception as exc:
        logger.warning("%s: the pool keeps its replicas for the tail (%s)", plan.slot, exc)
        return None


async def _shrink(
    pool: WorkerPool,
    lease_id: str,
    client: PoolClient,
    plan: Plan,
    lanes: int,
    run_root: str,
    so: StorageOptions | None,
    logger: Logger,
) -> int | None:
    if pool.backend == "static":  # not ours to scale
        return None
    layout = RunLayout(run_root)
    docs = await asyncio.to_thread(read_lanes, layout, plan.round, so)
    shards_left, running = round_left(plan, docs, lanes)
    workers, busy, concurrency = await worker_load(client)
    if not workers:
        return None
    want = tail_replicas(shards_left, running, concurrency, busy, workers)
    if want >= workers:
        return None
    target = await asyncio.to_thread(pool.want, lease_id, want)
    # the demand now: a Kubernetes pool removes the pods after scaledown_ttl_s (target: its count now)
    logger.info("%s: replicas %d -> %d: %d lanes left", plan.slot, workers, want, running)
    await asyncio.to_thread(record_lease, layout.root, str(pool), want, so=so)
    return target


def take_back(
    pool: WorkerPool,
    lease_id: str,
    *,
    run_root: str,
    so: StorageOptions | None = None,
    logger: Logger = log,
) -> int:
    """A round about to run takes its lease's replicas back (what the run's setup asked for);
    returns the replicas the pool targets (blocking: the pool's calls are)."""
    target = pool.want(lease_id, None)
    if pool.backend != "static":
        record_lease(run_root, str(pool), target, so=so)
    return target
