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
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

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
    read_lanes,
    write_lane,
)
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.state.shards import PlannedShard
from airflow_batchinfer.storage import swap, taper
from airflow_batchinfer.storage.json_doc import write_bytes
from airflow_batchinfer.storage.location import StorageOptions, resolve

log = logging.getLogger("airflow_batchinfer.lanes")

ShardDone = Callable[[LaneShard], None]  # called after each shard the lane ends (progress, logs)
# A round's lanes run each shard's jobs ("run"); with a judge on its own pool, "judge" lanes (bounded
# by that pool's Airflow pool) judge the shards the run's lanes have inferred (run.judge_lanes).
LaneRole = Literal["run", "judge"]


# ------------------------------------------------------------------------------------ decisions
@dataclass(frozen=True)
class Lane:
    """One lane of one round slot: what a mapped lane task is given (:meth:`as_dict`, in XCom)."""

    slot: str
    round: int
    index: int
    count: int
    role: LaneRole = "run"

    @property
    def judge(self) -> bool:
        return self.role == "judge"

    def as_dict(self) -> dict[str, Any]:
        lane = {"slot": self.slot, "round": self.round, "lane": self.index, "lanes": self.count}
        return {**lane, "role": self.role} if self.judge else lane

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Lane:
        role = data.get("role", "run")
        try:
            if role not in ("run", "judge"):
                raise ValueError(f"role {role!r} is neither run nor judge")
            index, count = int(data["lane"]), int(data["lanes"])
            lane = cls(str(data["slot"]), int(data["round"]), index, count, role)
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


def lanes_of(plan: Plan, count: int, role: LaneRole = "run") -> list[dict[str, Any]]:
    """The lane descriptors of ``plan`` (``[]`` for a round that does not run, and for judge lanes of
    a round whose shards are not judged on a pool of their own: :func:`judged_apart`)."""
    if plan.mode == "skip" or not plan.shards:
        return []
    n = min(count, len(plan.shards))
    return [Lane(plan.slot, plan.round, i, n, role).as_dict() for i in range(n)]


def judged_apart(cfg: RunConfig, plan: Plan) -> bool:
    """Whether the round's judge jobs run on the judge's own pool, from judge lanes of their own."""
    return "judge" in round_kinds(cfg, plan.mode)


def judge_lanes_of(cfg: RunConfig, plan: Plan, slots: int, bound: int) -> list[dict[str, Any]]:
    """The judge lane descriptors of ``plan`` (``cfg``: the settings its round runs): one per slot of
    the judge pool (``slots``), never more than the shards nor ``bound`` (Airflow's
    ``max_map_length``); none when the round does not judge on a pool of its own."""
    if not judged_apart(cfg, plan):
        return []
    return lanes_of(plan, min(lane_count(0, slots, len(plan.shards)), bound), "judge")


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
    layout: RunLayout,
    r: int,
    shard_id: str,
    lane: int,
    so: StorageOptions | None = None,
    *,
    judge: bool = False,
) -> bool:
    """Create the claim of ``shard_id`` for ``lane`` (a judge claim: ``judge``; an inference lane that
    judges a shard the judge lanes left takes one with ``lane`` -1); ``False`` when another holds it."""
    loc = resolve(layout.claim(r, shard_id, judge=judge), so)
    swap.require_exact(loc, f"Claiming shard {shard_id} of round {r}")
    token = uuid.uuid4().hex
    mine = ShardClaim(shard_id=shard_id, lane=lane, token=token, claimed_at=time.time()).encode()
    written = swap.update(loc, lambda current: mine if current is None else current)
    return written == mine


def clear_claims(layout: RunLayout, r: int, so: StorageOptions | None = None) -> None:
    """Forget round ``r``'s claims and lane documents: its plan task does it when it plans the round
    (again), so a re-planned round's lanes start from its new shard list."""
    from airflow_batchinfer.storage.files import remove_tree

    judging = (layout.claims(r, judge=True), layout.lanes(r, judge=True), layout.handoffs(r))
    for uri in (layout.claims(r), layout.lanes(r), *judging):
        loc = resolve(uri, so)
        loc.fs.invalidate_cache(loc.path)  # a cached listing misses other processes' claims: all go
        remove_tree(uri, so)


# ------------------------------------------------------------------------------------ the loop
@dataclass
class LaneState:
    """A lane's status document and where it is saved."""

    layout: RunLayout
    doc: LaneDoc
    so: StorageOptions | None
    judge: bool = False

    def save(self) -> None:
        write_lane(self.layout, self.doc, self.so, judge=self.judge)


async def run_job(
    pool: PoolClient, cfg: RunConfig, kind: JobKind, r: int, shard: PlannedShard, so: StorageOptions | None
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
            await asyncio.to_thread(record_job_error, cfg, r, shard.shard_id, kind, error, so)
    return error


async def run_shard(
    pools: Mapping[JobKind, PoolClient],
    cfg: RunConfig,
    plan: Plan,
    shard: PlannedShard,
    so: StorageOptions | None,
) -> str | None:
    """Every job of one shard, in order; the first job's last error stops the shard (``None``: it
    finished). A judge on its own pool is the judge lanes' (:mod:`~airflow_batchinfer.run.judge_lanes`):
    this lane hands the inferred shard over, and judges it itself only if they have all ended."""
    for kind in round_kinds(cfg, plan.mode):
        if kind == "judge":
            return await hand_over(pools["judge"], cfg, plan, shard, so)
        error = await run_job(pools[kind], cfg, kind, plan.round, shard, so)
        if error is not None:
            if kind == "infer" and judged_apart(cfg, plan):
                await asyncio.to_thread(mark_inferred, cfg, plan.round, shard.shard_id, "failed", so)
            return f"{kind}: {error}"
    return None


async def judge_shard(
    pool: PoolClient, cfg: RunConfig, plan: Plan, shard: PlannedShard, so: StorageOptions | None
) -> str | None:
    """A shard's judge job on the judge pool, reading the infer attempt its manifest names."""
    job_input = await asyncio.to_thread(judge_input, cfg, plan.round, shard, so)
    error = await run_job(pool, cfg, "judge", plan.round, job_input, so)
    return None if error is None else f"judge: {error}"


async def hand_over(
    pool: PoolClient, cfg: RunConfig, plan: Plan, shard: PlannedShard, so: StorageOptions | None
) -> str | None:
    """An inferred shard handed to the judge lanes: its mark written first, then the judge lanes'
    documents read. A judge lane that ends lists the marks again after it says so, so either it sees
    this mark or this lane sees it ended; the judge claim settles a tie. Judge lanes all ended (the
    inference outlived their patience, or a retried lane came back late): this lane judges the shard."""
    sid, r = shard.shard_id, plan.round
    await asyncio.to_thread(mark_inferred, cfg, r, sid, "done", so)
    layout = RunLayout(cfg.run_root)
    docs = await asyncio.to_thread(read_lanes, layout, r, so, judge=True)
    if not judge_lanes_ended(docs):
        return None
    if not await asyncio.to_thread(claim_shard, layout, r, sid, -1, so, judge=True):
        return None  # a judge lane took it after all
    log.info("round %d: the judge lanes have ended; shard %s judged by its inference lane", r, sid)
    return await judge_shard(pool, cfg, plan, shard, so)


def judge_lanes_ended(docs: Sequence[LaneDoc]) -> bool:
    """Whether every judge lane of a round has ended (each of its ``lanes`` documents ``finished``)."""
    return bool(docs) and len(docs) == docs[0].lanes and all(d.finished for d in docs)


def mark_inferred(cfg: RunConfig, r: int, shard_id: str, state: str, so: StorageOptions | None) -> None:
    """Tell the judge lanes that a shard's inference ended (``done`` or ``failed``)."""
    write_bytes(resolve(RunLayout(cfg.run_root).handoff(r, shard_id, state), so), b"")


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
    if (lane.slot, lane.round) != (plan.slot, plan.round) or lane.judge:
        raise ConfigError(f"lane {lane} is not a lane of the plan of {plan.slot} (round {plan.round})")
    layout = RunLayout(cfg.run_root)
    r = plan.round
    by_id = {s.shard_id: s for s in plan.shards}
    ids = list(by_id)
    sizes = {sid: int(s.records) for sid, s in by_id.items()}
    state, back = await resume_lane(layout, lane, plan, by_id, so)
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
        logger.info("lane %d of %s: shard %s (%d records)", lane.index, plan.slot, sid, shard.records)
        entry = await run_taken(state, shard, lambda s: run_shard(pools, cfg, plan, s, so))
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


async def resume_lane(
    layout: RunLayout, lane: Lane, plan: Plan, by_id: Mapping[str, PlannedShard], so: StorageOptions | None
) -> tuple[LaneState, list[str]]:
    """The lane's document as a try before this one left it (a new one when there is none, or it
    was for another lane count), and the shards it takes back: its unfinished one, and the one it
    was claiming."""
    r = plan.round
    doc = await asyncio.to_thread(read_lane, layout, r, lane.index, so, judge=lane.judge)
    claiming = None
    if doc is not None and doc.claiming:
        claiming = await asyncio.to_thread(read_claim, layout, r, doc.claiming, so, judge=lane.judge)
    back = [s for s in retake(doc, claiming) if s in by_id]
    if doc is None or doc.lanes != lane.count:
        doc = LaneDoc(round=r, slot=plan.slot, lane=lane.index, lanes=lane.count)
    return LaneState(layout, doc, so, lane.judge), back


ShardRun = Callable[[PlannedShard], Awaitable[str | None]]  # a shard's jobs: their last error


async def run_taken(state: LaneState, shard: PlannedShard, run: ShardRun) -> LaneShard:
    """Run a shard the lane has taken, its entry in the lane's document saved before (running) and
    after (done or failed, with the error)."""
    sid = shard.shard_id
    entry = state.doc.shard(sid)
    if entry is None:
        entry = LaneShard(shard_id=sid, records=shard.records, state="running", claimed_at=time.time())
        state.doc.shards.append(entry)
    entry.state, entry.ended_at, entry.error = "running", None, None
    state.doc.claiming = None
    await asyncio.to_thread(state.save)
    error = await run(shard)
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
