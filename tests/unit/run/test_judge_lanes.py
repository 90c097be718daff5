"""Judge lanes (:mod:`airflow_batchinfer.run.judge_lanes`): the pure step; the inference lanes and the
judge lanes of one round over real files (claims, marks, lane documents) with both pools faked at
their seam (``PoolClient.run``, finishing each job as a worker would), then the real close; the
hand-over when the judge lanes have ended, and a judge lane that stops waiting for a dead inference.
A real judge pool: tests/component/test_local_pool.py."""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.exceptions import JobFailed
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.run import judge_lanes, lanes
from airflow_batchinfer.run.close import close_round
from airflow_batchinfer.run.judge_lanes import judge_step, run_judge_lane
from airflow_batchinfer.run.lane_start import take_first
from airflow_batchinfer.run.lanes import Lane, judge_lanes_of, lanes_of, run_lane
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import Plan
from airflow_batchinfer.state.docs.lanes import claimed_shards, read_claim, read_lanes
from airflow_batchinfer.state.docs.shard_status import round_status
from airflow_batchinfer.state.layout import RunLayout
from tests.support.fake_jobs import ENGINE, counted, finish_job, judge_shard, plan_round, read_rows
from tests.support.lane_rounds import lanes_run

IDS = ("s0", "s1", "s2", "s3")


# ------------------------------------------------------------------------------------ the step
def test_a_judge_lane_takes_the_inferred_unclaimed_shards_from_its_own_place() -> None:
    inferred = {"s0": "done", "s1": "done", "s2": "done", "s3": "failed"}
    assert judge_step(IDS, 0, inferred, {"s1"}, 0.0).take == ("s0", "s2")
    assert judge_step(IDS, 1, inferred, {"s1"}, 0.0).take == ("s2", "s0")  # lanes start apart
    assert judge_step(IDS, 0, inferred, set(), 0.0).take == ("s0", "s1", "s2")  # never a failed one


def test_a_judge_lane_waits_while_shards_are_inferred_then_ends() -> None:
    assert judge_step(IDS, 0, {"s0": "done"}, {"s0"}, 10.0, patience_s=60).wait
    ended = judge_step(IDS, 0, dict.fromkeys(IDS, "done"), set(IDS), 0.0)
    assert ended.end is not None and "every shard's inference has ended" in ended.end
    assert not ended.take and not ended.wait


def test_a_judge_lane_stops_waiting_for_an_inference_that_does_not_end() -> None:
    step = judge_step(IDS, 0, {"s0": "done"}, {"s0"}, 61.0, patience_s=60)
    assert step.end is not None and "3 shards still to infer" in step.end
    assert "the inference lanes judge the shards they finish" in step.end


def test_judge_lanes_are_one_per_judge_slot_and_only_where_the_judge_has_its_own_pool(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    judged = lanes_run(tmp_path / "a", n=30, per_shard=3, judge_pool="local://judge")
    plan = plan_round(judged)
    lanes = judge_lanes_of(judged, plan, 4, 1024)
    assert lanes == [{**d, "role": "judge"} for d in lanes_of(plan, 4)]
    assert [Lane.of(d) for d in lanes] == [Lane("round-00", 0, i, 4, "judge") for i in range(4)]
    assert len(judge_lanes_of(judged, plan, 64, 1024)) == 10  # never more than the shards
    assert len(judge_lanes_of(judged, plan, 64, 6)) == 6  # nor Airflow's max_map_length
    fused = lanes_run(tmp_path / "b", n=30, per_shard=3)
    assert judge_lanes_of(fused, plan_round(fused), 4, 1024) == []  # judged with inference


# ------------------------------------------------------------------------------------ the loop
class KindPool:
    """A pool finishing each infer or judge job as a worker would (ids in ``approve`` approved); the
    infer jobs of ``fail`` fail, those of ``hold`` wait for ``gate``. ``ran``: (kind, shard) in order."""

    def __init__(
        self, cfg: RunConfig, plan: Plan, approve: Collection[str], fail: Collection[str] = ()
    ) -> None:
        layout = RunLayout(cfg.run_root)
        self.cfg, self.plan, self.approve, self.fail = cfg, plan, set(approve), set(fail)
        self.by_manifest = {
            layout.job_manifest(plan.round, s.shard_id, kind): s
            for s in plan.shards
            for kind in ("infer", "judge")
        }
        self.ran: list[tuple[str, str]] = []
        self.hold: set[str] = set()
        self.gate = asyncio.Event()

    async def run(self, spec: JobSpec, **_: Any) -> Any:
        shard = self.by_manifest[spec.outputs["manifest"]]
        sid = shard.shard_id
        self.ran.append((spec.kind, sid))
        if spec.kind == "judge":
            return await asyncio.to_thread(judge_shard, self.cfg, self.plan.round, shard, self.approve)
        if sid in self.hold:
            await self.gate.wait()
        if sid in self.fail:
            raise JobFailed(spec.job_id, "failed", "engine died")
        rows = [{**row, "result": "x", "status": "ok"} for row in read_rows(shard.uri)]
        return await asyncio.to_thread(
            finish_job, self.cfg, "infer", self.plan.round, shard, {"inferred": rows}, counted(ok=len(rows))
        )


def judged_run(tmp_path: Path, **settings: Any) -> tuple[RunConfig, Plan]:
    cfg = lanes_run(tmp_path, n=30, per_shard=3, judge_pool="local://judge", job_retries=0, **settings)
    plan = plan_round(cfg)
    plan.engine = plan.judge_engine = dict(ENGINE)
    return cfg, plan


async def test_judge_lanes_judge_each_inferred_shard_once_on_the_judge_pool(tmp_path: Path) -> None:
    cfg, plan = judged_run(tmp_path)
    ids = [s.shard_id for s in plan.shards]
    approve = {f"r{i:02d}" for i in range(0, 30, 3)}
    gpu, judges = KindPool(cfg, plan, approve, fail={ids[4]}), KindPool(cfg, plan, approve)
    pools: Any = {"infer": gpu, "judge": judges}
    runs = [run_lane(Lane(plan.slot, 0, i, 3), cfg, plan, pools) for i in range(3)]
    judging = [
        run_judge_lane(Lane(plan.slot, 0, i, 2, "judge"), cfg, plan, judges, poll_s=0.01) for i in range(2)
    ]
    docs = await asyncio.gather(*runs, *judging)

    assert [k for k, _ in gpu.ran] == ["infer"] * 10 and {k for k, _ in judges.ran} == {"judge"}
    assert sorted(s for _, s in judges.ran) == sorted(set(ids) - {ids[4]})  # each inferred one, once
    judge_docs = docs[3:]
    assert all(d.finished for d in judge_docs)
    assert sorted(s.shard_id for d in judge_docs for s in d.shards) == sorted(set(ids) - {ids[4]})
    layout = RunLayout(cfg.run_root)
    assert [d.lane for d in read_lanes(layout, 0, judge=True)] == [0, 1]
    holders = {s.shard_id: d.lane for d in judge_docs for s in d.shards}
    assert {s: getattr(read_claim(layout, 0, s, judge=True), "lane", None) for s in holders} == holders
    status = {r.shard_id: r.state for r in round_status(layout, plan).rows}
    assert status == {**dict.fromkeys(ids, "done"), ids[4]: "failed"}

    summary = close_round(cfg, plan)
    assert summary is not None and summary["invariant"]["ok"], summary
    assert [f["shard_id"] for f in summary["failed_shards"]] == [ids[4]]  # quarantined, not lost
    assert summary["approved"] + summary["rejected"] == 27


async def test_judging_runs_while_the_rounds_last_inference_still_runs(tmp_path: Path) -> None:
    """Pipelined: the judge lanes judge every shard whose inference ended while one shard's inference
    is still running, and that one as soon as it ends."""
    cfg, plan = judged_run(tmp_path)
    ids = [s.shard_id for s in plan.shards]
    gpu, judges = KindPool(cfg, plan, approve=()), KindPool(cfg, plan, approve=())
    log = gpu.ran = judges.ran = []  # one log for both pools: the order their jobs started in
    gpu.hold = {ids[0]}
    pools: Any = {"infer": gpu, "judge": judges}
    tasks = [asyncio.create_task(run_lane(Lane(plan.slot, 0, i, 2), cfg, plan, pools)) for i in range(2)]
    tasks.append(
        asyncio.create_task(run_judge_lane(Lane(plan.slot, 0, 0, 1, "judge"), cfg, plan, judges, poll_s=0.01))
    )
    for _ in range(500):
        if sum(kind == "judge" for kind, _ in log) == len(ids) - 1:
            break
        await asyncio.sleep(0.01)
    assert sorted(s for kind, s in log if kind == "judge") == sorted(ids[1:])  # while ids[0] infers
    gpu.gate.set()
    await asyncio.gather(*tasks)
    assert log[-1] == ("judge", ids[0]) and log.count(("judge", ids[0])) == 1  # once it was inferred


async def test_a_shard_inferred_after_the_judge_lanes_ended_is_judged_by_its_inference_lane(
    tmp_path: Path,
) -> None:
    """A judge lane gives up on an inference that does not end (its lane's task died, say); when that
    shard is inferred later (the retried lane), its inference lane judges it on the judge pool: the
    judge lanes' documents say they all ended. Nothing is left unjudged."""
    cfg, plan = judged_run(tmp_path)
    ids = [s.shard_id for s in plan.shards]
    approve = {f"r{i:02d}" for i in range(30)}
    gpu, judges = KindPool(cfg, plan, approve), KindPool(cfg, plan, approve)
    pools: Any = {"infer": gpu, "judge": judges}
    layout = RunLayout(cfg.run_root)
    assert take_first(layout, plan, Lane(plan.slot, 0, 1, 2), None)  # lane 1 took its first shard, died
    await run_lane(Lane(plan.slot, 0, 0, 2), cfg, plan, pools)  # lane 0 infers all the rest
    judge_doc = await run_judge_lane(
        Lane(plan.slot, 0, 0, 1, "judge"), cfg, plan, judges, poll_s=0.01, patience_s=0.05
    )
    assert judge_doc.finished and ids[1] not in {s.shard_id for s in judge_doc.shards}

    judges.ran.clear()
    gpu_late = KindPool(cfg, plan, approve)
    await run_lane(Lane(plan.slot, 0, 1, 2), cfg, plan, {"infer": gpu_late, "judge": judges})
    assert ("judge", ids[1]) in judges.ran  # judged by the inference lane, on the judge pool
    assert read_claim(layout, 0, ids[1], judge=True).lane == -1  # type: ignore[union-attr]
    summary = close_round(cfg, plan)
    assert summary is not None and summary["invariant"]["ok"] and summary["approved"] == 30


async def test_a_judge_lane_that_ended_looks_once_more_and_judges_what_came_in_between(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last inference's mark lands after the judge lane's last look and before it says it ended
    (patience 0: it ends as soon as nothing is ready): its look after saying so finds the shard and
    judges it. Never both, never neither."""
    cfg, plan = judged_run(tmp_path)
    ids = [s.shard_id for s in plan.shards]
    judges = KindPool(cfg, plan, approve=())
    layout = RunLayout(cfg.run_root)

    def infer(sid: str) -> None:  # as an inference lane ends a shard: its job, then its mark
        shard = next(s for s in plan.shards if s.shard_id == sid)
        rows = [{**row, "result": "x", "status": "ok"} for row in read_rows(shard.uri)]
        finish_job(cfg, "infer", plan.round, shard, {"inferred": rows}, counted(ok=len(rows)))
        lanes.mark_inferred(cfg, 0, sid, "done", None)

    for sid in ids[:-1]:
        infer(sid)
    real = judge_lanes.inferred_shards

    def inferred(layout_: RunLayout, r: int, so: Any = None) -> dict[str, str]:
        found = real(layout_, r, so)
        if ids[-1] not in found and len(claimed_shards(layout, 0, judge=True)) == len(ids) - 1:
            infer(ids[-1])  # right after this look, which the judge lane ends on
        return found

    monkeypatch.setattr(judge_lanes, "inferred_shards", inferred)
    doc = await run_judge_lane(
        Lane(plan.slot, 0, 0, 1, "judge"), cfg, plan, judges, poll_s=0.01, patience_s=0.0
    )
    assert doc.finished and sorted(s.shard_id for s in doc.shards) == sorted(ids)
    assert sorted(s for _, s in judges.ran) == sorted(ids)
