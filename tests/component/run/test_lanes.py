"""Lanes racing for a round's shards, as threads and as processes, on local disk and on the S3 server (the
rest in tests/unit/run/test_lanes.py)."""

from __future__ import annotations

import multiprocessing
import threading
from typing import Any

import pytest

from airflow_batchinfer.run.lanes import (
    claim_shard,
    clear_claims,
)
from airflow_batchinfer.state.docs.lanes import (
    LaneDoc,
    claimed_shards,
    read_claim,
    read_lanes,
    write_lane,
)
from airflow_batchinfer.state.layout import RunLayout
from tests.support.roots import Root


@pytest.mark.s3
def test_claims_another_process_made_are_seen_and_cleared_whatever_this_one_listed(
    s3_server: Any,
) -> None:
    """s3fs keeps listings: a lane's view of the claims must not be the one it listed first, or it
    would try the same claimed shards forever; a new plan clears every claim, not the listed ones."""
    so = s3_server.storage_options()
    other = {**so, "skip_instance_cache": True}  # another process's own client
    layout = RunLayout(f"s3://{s3_server.bucket}/lanes-listing/run")
    assert claim_shard(layout, 0, "s0000", 0, so)
    assert claimed_shards(layout, 0, so) == {"s0000"}  # listed (and cached) here
    assert claim_shard(layout, 0, "s0001", 1, other)
    write_lane(layout, LaneDoc(round=0, slot="round-00", lane=1, lanes=2), other)
    assert claimed_shards(layout, 0, so) == {"s0000", "s0001"}
    assert [d.lane for d in read_lanes(layout, 0, so)] == [1]
    clear_claims(layout, 0, so)
    assert claimed_shards(layout, 0, other) == set() and read_lanes(layout, 0, other) == []
    assert claim_shard(layout, 0, "s0001", 0, so)  # a cleared round's shards are anyone's again


# ------------------------------------------------------------------------------------ claims
SHARDS = [f"s{i:04d}" for i in range(40)]


def race_threads(layout: RunLayout, so: dict[str, Any]) -> dict[int, list[str]]:
    start = threading.Barrier(2)
    won: dict[int, list[str]] = {0: [], 1: []}

    def lane(i: int) -> None:
        start.wait()
        won[i] = [s for s in SHARDS if claim_shard(layout, 0, s, i, so)]

    threads = [threading.Thread(target=lane, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won


def claim_each(run_root: str, lane: int, so: dict[str, Any], start: Any, out: Any) -> None:
    """One racing process: claim every shard, in the same order as the other."""
    start.wait()
    layout = RunLayout(run_root)
    out.put((lane, [s for s in SHARDS if claim_shard(layout, 0, s, lane, so)]))


def race_processes(layout: RunLayout, so: dict[str, Any]) -> dict[int, list[str]]:
    ctx = multiprocessing.get_context("spawn")  # not fork: this process runs threads (pytest's, s3fs's)
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=claim_each, args=(layout.root, i, so, start, out)) for i in (0, 1)]
    for p in procs:
        p.start()
    start.set()
    won = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return won


@pytest.mark.parametrize("race", [race_threads, race_processes], ids=["threads", "processes"])
def test_two_lanes_racing_for_the_same_shards_claim_each_once(root: Root, race: Any) -> None:
    layout = RunLayout(root.uri("run"))
    won = race(layout, root.storage_options)
    assert sorted(won[0] + won[1]) == SHARDS  # each shard claimed exactly once: by one of them
    for lane, shards in won.items():
        for s in shards:
            claim = read_claim(layout, 0, s, root.storage_options)
            assert claim is not None and (claim.shard_id, claim.lane) == (s, lane)
    assert claimed_shards(layout, 0, root.storage_options) == set(SHARDS)
    assert not any(claim_shard(layout, 0, s, 2, root.storage_options) for s in SHARDS)  # nor later
