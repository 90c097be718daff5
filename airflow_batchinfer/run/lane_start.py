"""A round's lanes started by whoever plans the round: each lane's first shard claimed for it and its
first job submitted, before the lanes themselves start.

A lane task starts seconds after its plan task ends (the scheduler expands the map, an executor
slot starts a process, the task defers, a triggerer picks the trigger up): the GPUs would idle for
that long at the start of every round. The plan task knows the lanes and their first shards
(:func:`~airflow_batchinfer.run.lanes.stripe`), so it takes them as the lane would: a claim
(:func:`~airflow_batchinfer.run.lanes.claim_shard`), then the lane's document with the shard
``claimed``, then the job. The lane, once it runs, takes that shard back first
(:func:`~airflow_batchinfer.run.lanes.retake`) and follows its job where it runs
(:meth:`~airflow_batchinfer.rpc.pool.PoolClient.run` asks the workers before submitting), or finds it
finished. Best effort: a shard whose job could not be submitted here (no free slot, a worker that
does not answer) is simply run by its lane, which holds its claim.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from airflow_batchinfer.exceptions import BatchInferError
from airflow_batchinfer.rpc.pool import PoolClient
from airflow_batchinfer.run.jobs import job_spec, round_kinds
from airflow_batchinfer.run.lanes import Lane, claim_shard, stripe
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import Plan
from airflow_batchinfer.state.docs.lanes import LaneDoc, LaneShard, write_lane
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.state.shards import PlannedShard
from airflow_batchinfer.storage.location import StorageOptions

log = logging.getLogger("airflow_batchinfer.lanes")


def take_first(layout: RunLayout, plan: Plan, lane: Lane, so: StorageOptions | None) -> PlannedShard | None:
    """Claim ``lane``'s first shard for it and record it in its document (``claimed``); returns the
    shard, or ``None`` if it has none or another lane holds it."""
    own = stripe([s.shard_id for s in plan.shards], lane.index, lane.count)
    if not own:
        return None
    sid = own[0]
    shard = next(s for s in plan.shards if s.shard_id == sid)
    doc = LaneDoc(round=plan.round, slot=plan.slot, lane=lane.index, lanes=lane.count, claiming=sid)
    write_lane(layout, doc, so)  # first, as the lane does: a claim is never left unrecorded
    if not claim_shard(layout, plan.round, sid, lane.index, so):
        return None
    entry = LaneShard(shard_id=sid, records=shard.records, state="claimed", claimed_at=time.time())
    doc.shards, doc.claiming = [entry], None
    write_lane(layout, doc, so)
    return shard


async def start_lanes(
    cfg: RunConfig,
    plan: Plan,
    lanes: list[dict[str, Any]],
    client: PoolClient,
    so: StorageOptions | None = None,
) -> list[str]:
    """Claim each lane's first shard and submit its first job on ``client`` (the run's pool), all
    lanes at once; returns the shards whose jobs were submitted (or had finished already).

    ``cfg``: the settings the round runs (``plan.effective_config`` of run.json's); ``lanes``: the
    round's lane descriptors, just planned (its claims cleared). A round whose first job runs on
    another pool (a judge's own) starts only what runs on ``client``'s."""
    layout = RunLayout(cfg.run_root)
    kind = round_kinds(cfg, plan.mode)[0]

    async def one(descriptor: dict[str, Any]) -> str | None:
        lane = Lane.of(descriptor)
        shard = await asyncio.to_thread(take_first, layout, plan, lane, so)
        if shard is None:
            return None
        try:
            spec = await client.pinned(job_spec(cfg, kind, plan.round, shard))
            if await client.finished(spec) is None:
                await client.submit(spec)  # a copy already running (an earlier plan's) is followed
        except (BatchInferError, OSError) as exc:  # its lane runs it: it holds the claim
            log.warning(
                "lane %d of %s: shard %s not started here (%s); its lane runs it",
                lane.index,
                plan.slot,
                shard.shard_id,
                exc,
            )
            return None
        return shard.shard_id

    started = await asyncio.gather(*(one(d) for d in lanes))
    return [s for s in started if s is not None]
