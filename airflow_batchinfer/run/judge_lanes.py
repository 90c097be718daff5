"""Judge lanes: with a judge on its own pool (``judge_pool``), a round's judge jobs run from lanes of
their own, bounded by the judge pool's slots (a DAG: mapped in the judge's Airflow pool,
``judge_airflow_pool``), beside the round's inference lanes (:mod:`~airflow_batchinfer.run.lanes`).

An inference lane that ends a shard's inference marks it (``round-NN/inferred-shards/<shard>.done``
or ``.failed``: :func:`~airflow_batchinfer.run.lanes.mark_inferred`). A judge lane lists the marks and
the judge claims (``round-NN/judge-claims/``: two listings per look, whatever the shard count), claims
an inferred shard no judge lane holds and runs its judge job, and waits while shards are still being
inferred. Its status document is ``round-NN/judge-lanes/lane-NNNN.json``: a retried judge lane takes
its unfinished shard back first, as an inference lane does.

A judge lane ends when every shard's inference has ended and each inferred shard is judged or taken,
or when no inference has ended for :data:`PATIENCE_S` (an inference lane whose task died waits for
Airflow's retry; its shards must not hold the judge lanes, and their Airflow pool, for hours). Nothing
is lost either way: an inference lane hands a shard over by writing its mark and then reading the
judge lanes' documents, and a judge lane that ends writes ``finished`` and then lists the marks once
more, so one of them sees the other; the inference lane judges the shard itself when every judge lane
has ended (:func:`~airflow_batchinfer.run.lanes.hand_over`), and the judge claim settles a tie.

The decision is pure (:func:`judge_step`); :func:`run_judge_lane` gathers observations and acts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.rpc.pool import PoolClient
from airflow_batchinfer.run.lanes import (
    Lane,
    ShardDone,
    claim_shard,
    judge_shard,
    resume_lane,
    run_taken,
)
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import Plan
from airflow_batchinfer.state.docs.lanes import LaneDoc, claimed_shards, listed_now
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage.location import StorageOptions

log = logging.getLogger("airflow_batchinfer.lanes")

POLL_S = 2.0  # how often, at most, a judge lane with nothing to judge looks again (from an eighth of it)
PATIENCE_S = 900.0  # how long it waits for an inference to end before it leaves the rest to them
INFERRED_STATES = ("done", "failed")


@dataclass(frozen=True)
class JudgeStep:
    """What a judge lane does next: try to claim ``take`` (in that order), ``wait``, or ``end``
    (why it ends)."""

    take: tuple[str, ...] = ()
    wait: bool = False
    end: str | None = None


def judge_step(
    shard_ids: Sequence[str],
    lane: int,
    inferred: Mapping[str, str],
    claimed: Collection[str],
    idle_s: float,
    patience_s: float = PATIENCE_S,
) -> JudgeStep:
    """The next step of judge lane ``lane``: the inferred shards no judge lane claimed, in the plan's
    order from the lane's own place in it (lanes start apart instead of racing for one claim); else
    wait while some shard's inference has not ended, for at most ``patience_s`` since the last one
    ended (``idle_s``); else end. ``inferred``: shard -> ``done`` or ``failed``."""
    ready = [s for s in shard_ids if inferred.get(s) == "done" and s not in claimed]
    if ready:
        k = lane % len(ready)
        return JudgeStep(take=tuple(ready[k:] + ready[:k]))
    left = sum(1 for s in shard_ids if s not in inferred)
    if not left:
        return JudgeStep(end="every shard's inference has ended, and each inferred shard is judged")
    if idle_s >= patience_s:
        return JudgeStep(
            end=f"no inference ended for {idle_s:.0f} s with {left} shards still to infer: the inference "
            "lanes judge the shards they finish from now"
        )
    return JudgeStep(wait=True)


def inferred_shards(layout: RunLayout, r: int, so: StorageOptions | None = None) -> dict[str, str]:
    """Round ``r``'s shards whose inference ended -> ``done`` or ``failed`` (one fresh listing)."""
    found: dict[str, str] = {}
    for name in listed_now(layout.handoffs(r), so):
        sid, _, state = name.rpartition(".")
        if sid and state in INFERRED_STATES and found.get(sid) != "done":  # a retry's done wins
            found[sid] = state
    return found


async def run_judge_lane(
    lane: Lane,
    cfg: RunConfig,
    plan: Plan,
    pool: PoolClient,
    *,
    so: StorageOptions | None = None,
    on_shard: ShardDone | None = None,
    logger: logging.Logger | logging.LoggerAdapter[Any] = log,
    poll_s: float = POLL_S,
    patience_s: float = PATIENCE_S,
    clock: Callable[[], float] = time.monotonic,
) -> LaneDoc:
    """Run judge lane ``lane`` of ``plan`` on the judge pool ``pool`` until it ends
    (:func:`judge_step`); returns its status document."""
    if (lane.slot, lane.round) != (plan.slot, plan.round) or not lane.judge:
        raise ConfigError(f"lane {lane} is not a judge lane of the plan of {plan.slot} (round {plan.round})")
    layout, r = RunLayout(cfg.run_root), plan.round
    by_id = {s.shard_id: s for s in plan.shards}
    ids = list(by_id)
    state, back = await resume_lane(layout, lane, plan, by_id, so)
    where = f"judge lane {lane.index} of {plan.slot}"

    async def judge(sid: str) -> None:
        shard = by_id[sid]
        logger.info("%s: judging shard %s (%d records)", where, sid, shard.records)
        entry = await run_taken(state, shard, lambda s: judge_shard(pool, cfg, plan, s, so))
        if entry.error is not None:
            logger.error("%s: shard %s failed: %s", where, sid, entry.error)
        if on_shard is not None:
            on_shard(entry)

    async def take(sid: str) -> bool:
        state.doc.claiming = sid
        await asyncio.to_thread(state.save)
        return await asyncio.to_thread(claim_shard, layout, r, sid, lane.index, so, judge=True)

    async def look() -> tuple[dict[str, str], set[str]]:
        inferred = await asyncio.to_thread(inferred_shards, layout, r, so)
        return inferred, await asyncio.to_thread(claimed_shards, layout, r, so, judge=True)

    if back:
        logger.info("%s: taking back %s", where, back)
    for sid in back:
        await judge(sid)
    seen, since, delay = -1, clock(), poll_s / 8
    while True:
        inferred, claimed = await look()
        if len(inferred) != seen:
            seen, since = len(inferred), clock()
        step = judge_step(ids, lane.index, inferred, claimed, clock() - since, patience_s)
        if step.take:
            delay = poll_s / 8  # a shard was ready: the next is likely soon
            for sid in step.take:
                if await take(sid):
                    await judge(sid)
                    break
            continue
        if step.wait:
            await asyncio.sleep(delay)
            delay = min(delay * 2, poll_s)
            continue
        # Ended: said first, then one more look (see the module's doc), so no shard is left unjudged.
        state.doc.claiming, state.doc.finished = None, True
        await asyncio.to_thread(state.save)
        inferred, claimed = await look()
        if judge_step(ids, lane.index, inferred, claimed, 0.0, patience_s).take:
            state.doc.finished = False
            continue
        done = [s for s in state.doc.shards if s.state == "done"]
        logger.info(
            "%s: ends (%s); %d shards judged (%d records), %d failed",
            where,
            step.end,
            len(done),
            sum(s.records for s in done),
            len(state.doc.shards) - len(done),
        )
        return state.doc
