"""Lanes: a round's shards run by a fixed number of lanes, each running one shard at a time and
taking the next unclaimed shard until none is left.

Airflow maps one task per lane, not per shard, so a round may hold far more shards than
``[core] max_map_length`` while the scheduler sees at most ``lanes`` tasks; shards can be small (a
retried shard re-runs minutes of work, not hours), and a lane that finishes early takes more shards:
the round's tail is at most about one shard.

A shard is taken by a **claim**: ``round-NN/claims/<shard>.json``, created once
(:func:`~airflow_batchinfer.storage.swap.update`: an ``flock`` on a local disk, ``If-None-Match`` on
S3; a store without conditional writes is refused, as for the run-owner claim). Whoever created it
runs the shard this round. A lane takes its own *stripe* first (shards ``i, i + L, i + 2L, …`` of the
plan: no two lanes race for those), then steals unclaimed shards, the biggest first and then from the
end of the plan (the work the slowest lanes would do last): round 0's last shards are cut finer
(:mod:`~airflow_batchinfer.storage.taper`) so that the lanes end together. Each lane keeps a status
document (``round-NN/lanes/lane-NNNN.json``, :class:`~airflow_batchinfer.state.docs.lanes.LaneDoc`),
written before a claim (``claiming``) and after
each shard: a lane that restarts (a retried task, a restarted triggerer) takes back its own unfinished
shards first, and the report and the desk show every shard's state from these documents.

A shard's jobs (:func:`~airflow_batchinfer.run.jobs.round_kinds`) run as ``batchinfer run`` always
ran them: a failing job is retried ``job_retries`` times, then its error is kept next to its
manifest and the lane moves on (the round's close quarantines the shard). A job's own recovery (a
lost worker: resubmitted under the same id, resumed after its last committed chunk) is the pool
client's (:meth:`~airflow_batchinfer.rpc.pool.PoolClient.run`).

The decisions are pure (:func:`lane_count`, :func:`stripe`, :func:`steal_order`, :func:`retake`);
:func:`run_lane` gathers observations and acts. ``batchinfer run`` and the DAG's lane tasks (on the
triggerer, or in the task) call the same :func:`run_lane`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from airflow_batchinfer.exceptions import ConfigError, JobFailed
from airflow_batchinfer.rpc.models import JobKind
from airflow_batchinfer.rpc.pool import PoolClient
from airflow_batchinfer.run.jobs import job_spec, judge_input, record_job_error, round_kinds
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import Plan
from airflow_batchinfer.state.docs.lanes import (
    LaneDoc,
    LaneShard,
    ShardClaim,
    claimed_shards,
    read_claim,
    read_lane,
    write_lane,
)
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import ShardDescriptor, swap, taper
from airflow_batchinfer.storage.location import StorageOptions, resolve

log = logging.getLogger("airflow_batchinfer.lanes")

ShardDone = Callable[[LaneShard], None]  # called after each shard the lane ends (progress, logs)


# ------------------------------------------------------------------------------------ decisions
@dataclass(frozen=True)
class Lane:
    """One lane of one round slot: what a mapped lane task is given (:meth:`as_dict`, in XCom)."""

    slot: str
    round: int
    index: int
    count: int

    def as_dict(self) -> dict[str, Any]:
        return {"slot": self.slot, "round": self.round, "lane": self.index, "lanes": self.count}

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Lane:
        try:
            lane = cls(str(data["slot"]), int(data["round"]), int(data["lane"]), int(data["lanes"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"not a lane descriptor: {dict(data)!r} ({exc})") from exc
        if not 0 <= lane.index < lane.count:
            raise ConfigError(f"lane {lane.index} of {lane.count}: the index must be below the count")
        return lane


def lane_count(requested: int, slots: int, shards: int) -> int:
    """How many lanes a round of ``shards`` shards runs: ``requested`` (``0``: one per pool slot,
    ``slots``), never more than the shards (an idle lane is a task for nothing); 0 for no shards."""
    if requested < 0 or slots < 1:
        raise ConfigError(f"lanes must be >= 0 (0: one per pool slot), slots >= 1; got {requested}, {slots}")
    return min(requested or slots, shards)


def lanes_of(plan: Plan, count: int) -> list[dict[str, Any]]:
    """The lane descriptors of ``plan`` (``[]`` for a round that does not run)."""
    if plan.mode == "skip" or not plan.shards:
        return []
    n = min(count, len(plan.shards))
    return [Lane(plan.slot, plan.round, i, n).as_dict() for i in range(n)]


def stripe(shard_ids: Sequence[str], lane: int, lanes: int) -> list[str]:
    """A lane's own shards, taken first: ``lane, lane + lanes, …`` of the plan's order."""
    return list(shard_ids[lane::lanes])


def steal_order(
    shard_ids: Sequence[str],
    lane: int,
    lanes: int,
    claimed: Collection[str],
    records: Mapping[str, int] | None = None,
) -> list[str]:
    """The other lanes' unclaimed shards for a lane that has run out of its own: the biggest first
    (``records``, in steps of an eighth of the largest: a plan's last shards taper,
    :mod:`~airflow_batchinfer.storage.taper`, and are best left for the end, while a range's
    estimate a record off is the same size), then from the end of the plan (what the slowest lanes
    would run last, not the shards their owners take next)."""
    own = set(stripe(shard_ids, lane, lanes))
    order = [s for s in reversed(shard_ids) if s not in own and s not in claimed]
    if records and order:
        step = max(records.get(s, 0) for s in order) / taper.FINEST or 1.0
        order.sort(key=lambda s: -round(records.get(s, 0) / step))  # stable: alike stay from the end
    return order


def retake(doc: LaneDoc | None, claim_of_claiming: ShardClaim | None) -> list[str]:
    """What a restarted lane takes back first: its shards that did not end (claimed or running), and
    the shard it was claiming if the claim is its own."""
    if doc is None:
        return []
    back = [s.shard_id for s in doc.shards if s.state in ("claimed", "running")]
    sid = doc.claiming
    unrecorded = sid is not None and sid not in back and doc.shard(sid) is None
    if (
        unrecorded
        and sid is not None
        and claim_of_claiming is not None
        and claim_of_claiming.lane == doc.lane
    ):
        back.append(sid)
    return back


# ------------------------------------------------------------------------------------ storage
def claim_shard(
    layout: RunLayout, r: int, shard_id: str, lane: int, so: StorageOptions | None = None
) -> bool:
    """Create the claim of ``shard_id`` for ``lane``; ``False`` when another lane holds it."""
    loc = resolve(layout.claim(r, shard_id), so)
    swap.require_exact(loc, f"Claiming shard {shard_id} of round {r}")
    token = uuid.uuid4().hex
    mine = ShardClaim(shard_id=shard_id, lane=lane, token=token, claimed_at=time.time()).encode()
    written = swap.update(loc, lambda current: mine if current is None else current)
    return written == mine


def clear_claims(layout: RunLayout, r: int, so: StorageOptions | None = None) -> None:
    """Forget round ``r``'s claims and lane documents: its plan task does it when it plans the round
    (again), so a re-planned round's lanes start from its new shard list."""
    from airflow_batchinfer.storage.files import remove_tree

    for uri in (layout.claims(r), layout.lanes(r)):
        loc = resolve(uri, so)
        loc.fs.invalidate_cache(loc.path)  # a cached listing misses other processes' claims: all go
        remove_tree(uri, so)


# ------------------------------------------------------------------------------------ the loop
@dataclass
class _LaneState:
    layout: RunLayout
    doc: LaneDoc
    so: StorageOptions | None

    def save(self) -> None:
        write_lane(self.layout, self.doc, self.so)


async def _run_job(
    pool: PoolClient, cfg: RunConfig, kind: JobKind, r: int, shard: ShardDescriptor, so: StorageOptions | None
) -> str | None:
    """Run one shard job; a failing job is retried ``job_retries`` times. Returns the last error,
    ``None`` when it finished."""
    spec = job_spec(cfg, kind, r, shard)
    error = None
    for _ in range(cfg.budget.job_retries + 1):
        try:
            await pool.run(spec)
            return None
        except JobFailed as exc:
            error = str(exc)
            await asyncio.to_thread(record_job_error, cfg, r, shard["shard_id"], kind, error, so)
    return error


async def run_shard(
    pools: Mapping[JobKind, PoolClient],
    cfg: RunConfig,
    plan: Plan,
    shard: ShardDescriptor,
    so: StorageOptions | None,
) -> str | None:
    """Every job of one shard, in order (a judge on its own pool reads the infer attempt its manifest
    names); the first job's last error stops the shard (``None``: it finished)."""
    for kind in round_kinds(cfg, plan.mode):
        job_input = shard
        if kind == "judge":
            job_input = await asyncio.to_thread(judge_input, cfg, plan.round, shard, so)
        error = await _run_job(pools[kind], cfg, kind, plan.round, job_input, so)
        if error is not None:
            return f"{kind}: {error}"
    return None


async def run_lane(
    lane: Lane,
    cfg: RunConfig,
    plan: Plan,
    pools: Mapping[JobKind, PoolClient],
    *,
    so: StorageOptions | None = None,
    on_shard: ShardDone | None = None,
    logger: logging.Logger | logging.LoggerAdapter[Any] = log,
) -> LaneDoc:
    """Run ``lane`` of ``plan`` until no shard is left to take; returns its status document.

    ``cfg``: the settings the round runs (``plan.effective_config`` of run.json's). Errors that are
    not a job's (no worker took a job, storage unreachable) propagate: the caller fails or retries the
    lane, which then takes its unfinished shard back."""
    if (lane.slot, lane.round) != (plan.slot, plan.round):
        raise ConfigError(f"lane {lane} is not of the plan of {plan.slot} (round {plan.round})")
    layout = RunLayout(cfg.run_root)
    r = plan.round
    by_id = {s["shard_id"]: s for s in plan.shards}
    ids = list(by_id)
    sizes = {sid: int(s["records"]) for sid, s in by_id.items()}
    state, back = await _resume(layout, lane, plan, by_id, so)
    if back:
        logger.info("lane %d of %s: taking back %s", lane.index, plan.slot, back)
    own = [s for s in stripe(ids, lane.index, lane.count) if state.doc.shard(s) is None]

    async def take(shard_id: str) -> bool:
        state.doc.claiming = shard_id
        await asyncio.to_thread(state.save)
        return await asyncio.to_thread(claim_shard, layout, r, shard_id, lane.index, so)

    async def next_shard() -> str | None:
        if back:
            return back.pop(0)
        while own:
            sid = own.pop(0)
            if await take(sid):
                return sid
        while True:  # stolen: list the claims, try the unclaimed from the end, list again
            claimed = await asyncio.to_thread(claimed_shards, layout, r, so)
            candidates = steal_order(ids, lane.index, lane.count, claimed, sizes)
            if not candidates:
                return None
            for sid in candidates:
                if await take(sid):
                    return sid

    while (sid := await next_shard()) is not None:
        shard = by_id[sid]
        logger.info("lane %d of %s: shard %s (%d records)", lane.index, plan.slot, sid, shard["records"])
        entry = await _run_taken(state, shard, pools, cfg, plan, so)
        if entry.error is not None:
            logger.error("lane %d of %s: shard %s failed: %s", lane.index, plan.slot, sid, entry.error)
        if on_shard is not None:
            on_shard(entry)
    state.doc.claiming, state.doc.finished = None, True
    await asyncio.to_thread(state.save)
    done = [s for s in state.doc.shards if s.state == "done"]
    logger.info(
        "lane %d of %s: no shard left; %d done (%d records), %d failed",
        lane.index,
        plan.slot,
        len(done),
        sum(s.records for s in done),
        len(state.doc.shards) - len(done),
    )
    return state.doc


async def _resume(
    layout: RunLayout, lane: Lane, plan: Plan, by_id: Mapping[str, ShardDescriptor], so: StorageOptions | None
) -> tuple[_LaneState, list[str]]:
    """The lane's document as a try before this one left it (a new one when there is none, or it
    was for another lane count), and the shards it takes back: its unfinished one, and the one it
    was claiming."""
    r = plan.round
    doc = await asyncio.to_thread(read_lane, layout, r, lane.index, so)
    claiming = None
    if doc is not None and doc.claiming:
        claiming = await asyncio.to_thread(read_claim, layout, r, doc.claiming, so)
    back = [s for s in retake(doc, claiming) if s in by_id]
    if doc is None or doc.lanes != lane.count:
        doc = LaneDoc(round=r, slot=plan.slot, lane=lane.index, lanes=lane.count)
    return _LaneState(layout, doc, so), back


async def _run_taken(
    state: _LaneState,
    shard: ShardDescriptor,
    pools: Mapping[JobKind, PoolClient],
    cfg: RunConfig,
    plan: Plan,
    so: StorageOptions | None,
) -> LaneShard:
    """Run a shard the lane has taken, its entry in the lane's document saved before (running) and
    after (done or failed, with the error)."""
    sid = shard["shard_id"]
    entry = state.doc.shard(sid)
    if entry is None:
        entry = LaneShard(shard_id=sid, records=shard["records"], state="running", claimed_at=time.time())
        state.doc.shards.append(entry)
    entry.state, entry.ended_at, entry.error = "running", None, None
    state.doc.claiming = None
    await asyncio.to_thread(state.save)
    error = await run_shard(pools, cfg, plan, shard, so)
    entry.state = "done" if error is None else "failed"
    entry.ended_at, entry.error = time.time(), error
    await asyncio.to_thread(state.save)
    return entry


class LaneResult(TypedDict):
    """A lane task's return value (XCom): small, whatever the shard count; ``failed``: the first 20."""

    slot: str
    round: int
    lane: int
    shards: int
    done: int
    records: int
    failed: list[str]
    failed_count: int


def lane_result(doc: LaneDoc) -> LaneResult:
    """What a finished lane returns."""
    done = [s for s in doc.shards if s.state == "done"]
    failed = [s.shard_id for s in doc.shards if s.state == "failed"]
    return LaneResult(
        slot=doc.slot,
        round=doc.round,
        lane=doc.lane,
        shards=len(doc.shards),
        done=len(done),
        records=sum(s.records for s in done),
        failed=failed[:20],
        failed_count=len(failed),
    )
