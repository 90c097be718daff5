"""Rounds run by lanes for the report's and the desk's tests: the real lane loop
(:func:`~airflow_batchinfer.run.lanes.run_lane`: real claims, real lane documents) over a pool that
finishes each shard's job as a worker would (:mod:`tests.support.fake_jobs`) or fails it, then the
real close. The pool is the one fake: the seam :class:`~airflow_batchinfer.rpc.pool.PoolClient`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from airflow_batchinfer.exceptions import JobFailed
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.run.jobs import round_kinds
from airflow_batchinfer.run.lanes import Lane, run_lane
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import Plan, read_plan
from airflow_batchinfer.state.docs.lanes import LaneDoc, read_lane, write_lane
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import shard_dataset
from airflow_batchinfer.storage.location import StorageOptions
from tests.support.fake_jobs import judge_shard


def lanes_run(tmp_path: Path, n: int = 30, per_shard: int = 3, **settings: Any) -> RunConfig:
    """A run of ``n`` records ``r00``… in shards of ``per_shard`` (many small shards: what lanes are
    for), judged by an LLM judge fused with inference."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": f"r{i:02d}", "question": f"q {i}"}) + "\n" for i in range(n)))
    cfg = RunConfig.of(
        input=str(data),
        run_root=str(tmp_path / "run"),
        prompt_template="{{ question }}",
        records_per_shard=per_shard,
        **{"judge": {"type": "llm"}, **settings},
    )
    layout = RunLayout(cfg.run_root)
    cfg = cfg.replace(
        id_field=shard_dataset(cfg.data.input, layout.input, records_per_shard=per_shard).id_field
    )
    return cfg


BROKEN = "engine died: CUDA error: an illegal memory access was encountered"


class FinishingPool:
    """A pool whose every job finishes at once (ids in ``approve`` approved), but the jobs of the
    shards in ``fail`` (their ``JobFailed`` carries :data:`BROKEN`). ``ran`` lists the shard ids of
    the jobs it ran, in order."""

    def __init__(
        self,
        cfg: RunConfig,
        plan: Plan,
        approve: Collection[str],
        fail: Collection[str] = (),
        so: StorageOptions | None = None,
    ) -> None:
        self.cfg, self.plan, self.approve, self.fail, self.so = cfg, plan, set(approve), set(fail), so
        self.by_input = {s.uri: s for s in plan.shards}
        self.ran: list[str] = []

    async def run(self, spec: JobSpec, **_: Any) -> Any:
        shard = self.by_input[spec.input]
        self.ran.append(shard.shard_id)
        if shard.shard_id in self.fail:
            raise JobFailed(spec.job_id, "failed", BROKEN)
        return await asyncio.to_thread(
            judge_shard, self.cfg, self.plan.round, shard, self.approve, so=self.so
        )


def run_lanes(
    cfg: RunConfig,
    plan: Plan,
    lanes: int,
    pool: FinishingPool,
    so: StorageOptions | None = None,
) -> list[LaneDoc]:
    """Run every lane of ``plan`` at once on ``pool`` until no shard is left; their documents."""
    (kind,) = round_kinds(cfg, plan.mode)

    async def all_lanes() -> list[LaneDoc]:
        return await asyncio.gather(
            *(
                run_lane(Lane(plan.slot, plan.round, i, lanes), cfg, plan, {kind: pool}, so=so)  # type: ignore[dict-item]
                for i in range(lanes)
            )
        )

    # in a thread of its own: the caller may run an event loop already (Playwright's sync API does)
    with ThreadPoolExecutor(1) as ex:
        return ex.submit(lambda: asyncio.run(all_lanes())).result()


def set_times(cfg: RunConfig, r: int, lane: int, times: dict[str, tuple[float, float | None]]) -> None:
    """Give lane ``lane``'s shards known claim and end times (``times``: shard id -> both), so
    figures built from them can be checked exactly."""
    layout = RunLayout(cfg.run_root)
    doc = read_lane(layout, r, lane)
    assert doc is not None
    for entry in doc.shards:
        if entry.shard_id in times:
            entry.claimed_at, entry.ended_at = times[entry.shard_id]
    write_lane(layout, doc)


def planned(cfg: RunConfig, slot: str = "round-00") -> Plan:
    plan = read_plan(RunLayout(cfg.run_root), slot)
    assert plan is not None
    return plan
