"""Lanes (:mod:`airflow_batchinfer.run.lanes`): the pure decisions; claims raced by threads and by
processes on a local disk and on the real S3 server (a store without conditional writes refused);
the lane loop over real files with a pool faked at its seam (``PoolClient.run``, finishing each job
as a worker would: real manifests), then the real close. A real pool: tests/component/test_lanes_pool.py."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import fsspec
import pytest

from airflow_batchinfer.exceptions import ConfigError, WorkerUnavailable
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.run.close import close_round
from airflow_batchinfer.run.lanes import (
    Lane,
    claim_shard,
    clear_claims,
    lane_count,
    lane_result,
    lanes_of,
    retake,
    run_lane,
    steal_order,
    stripe,
)
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
from airflow_batchinfer.storage import JsonlDir, JsonlFile
from airflow_batchinfer.storage.location import resolve
from tests.support.fake_jobs import plan_round
from tests.support.lane_rounds import BROKEN, FinishingPool, lanes_run

IDS = [f"s{i:04d}" for i in range(7)]


# ------------------------------------------------------------------------------------ decisions
def test_lane_count_is_one_per_slot_unless_set_and_never_more_than_the_shards() -> None:
    assert lane_count(0, 8, 100) == 8  # 0: one lane per pool slot
    assert lane_count(3, 8, 100) == 3  # set: the pool's slots do not matter
    assert lane_count(0, 8, 5) == 5 and lane_count(40, 8, 5) == 5  # an idle lane is a task for nothing
    assert lane_count(0, 8, 0) == 0


@pytest.mark.parametrize(("requested", "slots"), [(-1, 8), (0, 0), (3, 0)])
def test_lane_count_refuses_a_negative_request_or_a_pool_without_slots(requested: int, slots: int) -> None:
    with pytest.raises(ConfigError, match=r"lanes must be >= 0 \(0: one per pool slot\), slots >= 1"):
        lane_count(requested, slots, 10)


def plan_of(n: int, mode: str = "rounds") -> Plan:
    shards = [{"shard_id": f"s{i:04d}", "uri": f"/in/s{i:04d}.jsonl", "records": 3} for i in range(n)]
    return Plan(slot="round-01", round=1, mode=mode, shards=shards)  # type: ignore[arg-type]


def test_lanes_of_a_round() -> None:
    lanes = lanes_of(plan_of(10), 4)
    assert lanes == [{"slot": "round-01", "round": 1, "lane": i, "lanes": 4} for i in range(4)]
    assert [Lane.of(d) for d in lanes] == [Lane("round-01", 1, i, 4) for i in range(4)]


def test_fewer_shards_than_lanes_run_one_lane_per_shard() -> None:
    assert [d["lanes"] for d in lanes_of(plan_of(2), 5)] == [2, 2]


def test_a_round_that_does_not_run_has_no_lanes() -> None:
    assert lanes_of(plan_of(10, mode="skip"), 4) == []
    assert lanes_of(plan_of(0), 4) == []


def test_a_lanes_stripe_is_every_lanes_th_shard_from_its_index() -> None:
    assert stripe(IDS, 0, 3) == ["s0000", "s0003", "s0006"]
    assert stripe(IDS, 2, 3) == ["s0002", "s0005"]
    assert sorted(s for i in range(3) for s in stripe(IDS, i, 3)) == IDS  # the stripes cover the plan once


def test_a_lane_steals_from_the_end_skipping_its_stripe_and_what_is_claimed() -> None:
    # lane 1 of 3 owns s0001, s0004; s0006 and s0002 are claimed already
    assert steal_order(IDS, 1, 3, {"s0006", "s0002", "s0001"}) == ["s0005", "s0003", "s0000"]
    assert steal_order(IDS, 1, 3, set(IDS)) == []


def test_a_lane_steals_the_biggest_first_when_the_plan_tapers() -> None:
    # the plan's last shards are cut finer: a lane out of work takes the big ones, leaving the end small
    sizes = {sid: 1_000 if sid >= "s0005" else 4_000 for sid in IDS}
    assert steal_order(IDS, 1, 3, {"s0001"}, sizes) == ["s0003", "s0002", "s0000", "s0006", "s0005"]
    # a range's size is an estimate: a record or two apart is the same size, still taken from the end
    noisy = {sid: 4_000 + i % 3 for i, sid in enumerate(IDS)}
    assert steal_order(IDS, 1, 3, {"s0001"}, noisy) == steal_order(IDS, 1, 3, {"s0001"})


def lane_doc(*shards: tuple[str, str], claiming: str | None = None, lane: int = 1) -> LaneDoc:
    entries = [LaneShard(shard_id=s, records=3, state=st, claimed_at=1.0) for s, st in shards]  # type: ignore[arg-type]
    return LaneDoc(round=1, slot="round-01", lane=lane, lanes=3, shards=entries, claiming=claiming)


def claim_by(shard_id: str, lane: int) -> ShardClaim:
    return ShardClaim(shard_id=shard_id, lane=lane, token="t", claimed_at=1.0)


def test_a_restarted_lane_takes_back_what_it_had_not_ended() -> None:
    doc = lane_doc(("s0001", "done"), ("s0004", "failed"), ("s0006", "running"), ("s0003", "claimed"))
    assert retake(doc, None) == ["s0006", "s0003"]  # ended shards are not run again
    assert retake(None, None) == []  # a lane that never wrote its document starts afresh


def test_the_shard_a_lane_was_claiming_comes_back_only_when_the_claim_is_its_own() -> None:
    doc = lane_doc(("s0001", "done"), claiming="s0005")
    assert retake(doc, claim_by("s0005", 1)) == ["s0005"]  # claimed, then stopped before recording it
    assert retake(doc, claim_by("s0005", 2)) == []  # another lane won that claim: it runs it
    assert retake(doc, None) == []  # stopped before the claim: the shard is anyone's
    recorded = lane_doc(("s0005", "running"), claiming="s0005")
    assert retake(recorded, claim_by("s0005", 1)) == ["s0005"]  # not twice


@pytest.mark.parametrize(
    ("data", "why"),
    [
        ({"slot": "round-00", "round": 0, "lane": 0}, "'lanes'"),
        ({"slot": "round-00", "round": 0, "lane": "first", "lanes": 2}, "invalid literal"),
        ({"slot": "round-00", "round": None, "lane": 0, "lanes": 2}, "NoneType"),
        ({"slot": "round-00", "round": 0, "lane": 2, "lanes": 2}, "lane 2 of 2: the index must be below"),
        ({"slot": "round-00", "round": 0, "lane": -1, "lanes": 2}, "lane -1 of 2: the index must be below"),
    ],
)
def test_a_lane_descriptor_that_is_not_one_is_refused(data: dict[str, Any], why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        Lane.of(data)


def test_a_claim_is_refused_on_a_store_without_conditional_writes() -> None:
    root = "memory://lanes-unsafe/run"
    with pytest.raises(
        ConfigError,
        match=r"Claiming shard s0001 of round 0 is refused: memory://lanes-unsafe/run/round-00/claims/"
        r"s0001.json is on a memory:// store.*Remedy: put the run root on a local disk of one host.*S3",
    ):
        claim_shard(RunLayout(root), 0, "s0001", 0)
    assert not fsspec.filesystem("memory").exists("/lanes-unsafe/run/round-00/claims")  # nothing written


def test_clearing_a_round_forgets_its_claims_and_lane_documents(tmp_path: Path) -> None:
    layout = RunLayout(str(tmp_path / "run"))
    assert claim_shard(layout, 2, "s0000", 0)
    write_lane(layout, LaneDoc(round=2, slot="round-02", lane=0, lanes=1))
    assert claim_shard(layout, 1, "s0000", 0)  # another round's stay
    clear_claims(layout, 2)
    assert claimed_shards(layout, 2) == set() and read_lane(layout, 2, 0) is None
    assert claimed_shards(layout, 1) == {"s0000"}


# ------------------------------------------------------------------------------------ the loop
def ids_of(directory: str) -> list[str]:
    return [r["id"] for f in JsonlDir(directory).jsonl_files() for r in f.iter_records()]


def close_and_count(cfg: RunConfig, plan: Plan) -> tuple[dict[str, Any], Counter[str]]:
    """Close the round; how often each input id is in results, the next pending set or quarantine."""
    summary = close_round(cfg, plan)
    assert summary is not None
    layout = RunLayout(cfg.run_root)
    seen = ids_of(layout.results) + ids_of(layout.pending(plan.round + 1))
    for f in summary["failed_shards"]:
        seen += [r["id"] for r in JsonlFile(f["uri"]).iter_records()]
    return summary, Counter(seen)


def every_id(n: int) -> Counter[str]:
    return Counter(f"r{i:02d}" for i in range(n))


class SlowFirstPool(FinishingPool):
    """A pool whose job for ``slow`` (lane 0's first shard) ends only when ``release`` is set."""

    def __init__(self, *args: Any, slow: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slow, self.release = slow, asyncio.Event()

    async def run(self, spec: JobSpec, **kw: Any) -> Any:
        if self.by_input[spec.input].shard_id == self.slow:
            await self.release.wait()
        return await super().run(spec, **kw)


async def test_three_lanes_run_twenty_shards_once_each_and_steal_from_a_slow_lane(tmp_path: Path) -> None:
    cfg = lanes_run(tmp_path, n=60, per_shard=3)
    plan = plan_round(cfg)
    ids = [s.shard_id for s in plan.shards]
    assert len(ids) == 20
    approve = {f"r{i:02d}" for i in range(0, 60, 2)}
    pool = SlowFirstPool(cfg, plan, approve, slow=ids[0])
    pools: Any = {"infer_judge": pool}
    seen: list[str] = []
    lanes = [
        asyncio.create_task(
            run_lane(Lane(plan.slot, 0, i, 3), cfg, plan, pools, on_shard=lambda e: seen.append(e.shard_id))
        )
        for i in range(3)
    ]
    fast = await asyncio.gather(*lanes[1:])  # lane 0 is held on its first shard meanwhile
    pool.release.set()
    slow = await lanes[0]
    docs = {d.lane: d for d in [slow, *fast]}

    assert [s.shard_id for s in docs[0].shards] == [ids[0]]  # the rest of its stripe was stolen
    taken = [s.shard_id for d in docs.values() for s in d.shards]
    assert sorted(taken) == ids and sorted(pool.ran) == ids  # every shard once, its job once
    assert sorted(seen) == ids and all(s.state == "done" for d in docs.values() for s in d.shards)
    assert all(d.finished and d.claiming is None for d in docs.values())
    for i in (1, 2):
        order = [s.shard_id for s in docs[i].shards]
        own = stripe(ids, i, 3)
        k = sum(s in own for s in order)
        mine, stolen = order[:k], order[k:]
        assert mine == [s for s in own if s in order]  # its stripe first, in order
        assert [ids.index(s) for s in stolen] == sorted(
            (ids.index(s) for s in stolen), reverse=True
        )  # from the end
    layout = RunLayout(cfg.run_root)
    holders = {s.shard_id: d.lane for d in docs.values() for s in d.shards}
    assert {
        c: getattr(read_claim(layout, 0, c), "lane", None) for c in ids
    } == holders  # who ran it claimed it
    assert [d.lane for d in read_lanes(layout, 0)] == [0, 1, 2]  # as the report reads them
    assert lane_result(docs[0]) == {
        "slot": "round-00", "round": 0, "lane": 0, "shards": 1, "done": 1, "records": 3,
        "failed": [], "failed_count": 0,
    }  # fmt: skip

    summary, seen_ids = close_and_count(cfg, plan)
    assert summary["invariant"]["ok"], summary["invariant"]
    assert seen_ids == every_id(60)  # nothing lost, nothing doubled
    assert (summary["approved"], summary["rejected"], summary["failed_shards"]) == (30, 30, [])


@pytest.mark.parametrize("retries", [0, 2])
async def test_a_failing_job_is_retried_then_recorded_and_the_lane_goes_on(
    tmp_path: Path, retries: int
) -> None:
    cfg = lanes_run(tmp_path, n=12, per_shard=3, job_retries=retries)
    plan = plan_round(cfg)
    ids = [s.shard_id for s in plan.shards]
    pool = FinishingPool(cfg, plan, approve={"r00"}, fail={ids[1]})
    doc = await run_lane(Lane(plan.slot, 0, 0, 1), cfg, plan, {"infer_judge": pool})  # type: ignore[dict-item]

    assert pool.ran.count(ids[1]) == retries + 1 and sorted(set(pool.ran)) == ids
    states = {s.shard_id: (s.state, s.error) for s in doc.shards}
    assert states[ids[1]][0] == "failed" and BROKEN in (states[ids[1]][1] or "")
    assert states[ids[1]][1].startswith("infer_judge: job ")  # type: ignore[union-attr]
    assert [states[s][0] for s in ids if s != ids[1]] == ["done"] * 3  # it went on to the others
    assert lane_result(doc)["failed"] == [ids[1]] and lane_result(doc)["done"] == 3

    summary, seen = close_and_count(cfg, plan)
    [failed] = summary["failed_shards"]
    assert (failed["shard_id"], failed["phase"]) == (ids[1], "infer_judge")
    assert failed["error"].endswith(f"failed: {BROKEN}") and "re-run the DAG run" in failed["remedy"]
    assert summary["invariant"]["ok"] and seen == every_id(12)


async def test_a_lane_stopped_mid_shard_takes_it_back_first_when_restarted(tmp_path: Path) -> None:
    """No worker took the job of a shard it had stolen: the lane stops with the shard ``running``;
    restarted, it runs that shard before stealing more (else nobody would: it holds the claim)."""
    cfg = lanes_run(tmp_path, n=12, per_shard=3)  # 4 shards; lane 0 of 2 owns 0 and 2, steals 3 then 1
    plan = plan_round(cfg)
    ids = [s.shard_id for s in plan.shards]
    layout = RunLayout(cfg.run_root)

    class LosesAWorker(FinishingPool):
        async def run(self, spec: JobSpec, **kw: Any) -> Any:
            if self.by_input[spec.input].shard_id == ids[3]:
                raise WorkerUnavailable("http://127.0.0.1:1: connection refused")
            return await super().run(spec, **kw)

    lane = Lane(plan.slot, 0, 0, 2)
    with pytest.raises(WorkerUnavailable):
        await run_lane(lane, cfg, plan, {"infer_judge": LosesAWorker(cfg, plan, approve=())})  # type: ignore[dict-item]
    before = read_lane(layout, 0, 0)
    assert before is not None and [(s.shard_id, s.state) for s in before.shards] == [
        (ids[0], "done"), (ids[2], "done"), (ids[3], "running"),
    ]  # fmt: skip

    pool = FinishingPool(cfg, plan, approve=())
    doc = await run_lane(lane, cfg, plan, {"infer_judge": pool})  # type: ignore[dict-item]
    assert pool.ran == [ids[3], ids[1]]  # its own shard back first; nothing done re-run
    assert [(s.shard_id, s.state) for s in doc.shards] == [
        (i, "done") for i in (ids[0], ids[2], ids[3], ids[1])
    ]
    claim = read_claim(layout, 0, ids[3])
    assert claim is not None and claim.lane == 0
    summary, seen = close_and_count(cfg, plan)
    assert summary["invariant"]["ok"] and seen == every_id(12)


@pytest.mark.parametrize("holder", [0, 1])
async def test_a_lane_stopped_between_claim_and_record_runs_the_shard_only_if_it_won_it(
    tmp_path: Path, holder: int
) -> None:
    cfg = lanes_run(tmp_path, n=12, per_shard=3)
    plan = plan_round(cfg)
    ids = [s.shard_id for s in plan.shards]
    layout = RunLayout(cfg.run_root)
    # lane 0 wrote that it was claiming shard 3 (lane 1's), then stopped; the claim is ``holder``'s
    write_lane(layout, LaneDoc(round=0, slot=plan.slot, lane=0, lanes=2, claiming=ids[3]))
    assert claim_shard(layout, 0, ids[3], holder)
    pool = FinishingPool(cfg, plan, approve=())
    doc = await run_lane(Lane(plan.slot, 0, 0, 2), cfg, plan, {"infer_judge": pool})  # type: ignore[dict-item]
    if holder == 0:
        assert pool.ran == [ids[3], ids[0], ids[2], ids[1]]  # its claim: first, or nobody runs it
    else:
        assert pool.ran == [ids[0], ids[2], ids[1]]  # lane 1's: lane 1 runs it
    assert doc.claiming is None and doc.finished


async def test_a_lane_of_another_round_is_refused(tmp_path: Path) -> None:
    cfg = lanes_run(tmp_path, n=6, per_shard=3)
    plan = plan_round(cfg)
    with pytest.raises(ConfigError, match=r"is not a lane of the plan of round-00 \(round 0\)"):
        await run_lane(Lane("round-01", 1, 0, 1), cfg, plan, {})
    assert claimed_shards(RunLayout(cfg.run_root), 0) == set()  # nothing claimed


def test_a_claim_lives_where_the_layout_says(tmp_path: Path) -> None:
    layout = RunLayout(str(tmp_path / "run"))
    assert claim_shard(layout, 3, "s0007", 5)
    assert resolve(layout.claim(3, "s0007")).fs.exists(
        str(tmp_path / "run" / "round-03" / "claims" / "s0007.json")
    )
