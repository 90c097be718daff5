"""The round controller's shard descriptors: a changed round's name its slot, whose plan holds the
settings the round runs (the mapped jobs read them there; templates stay out of XCom); an unchanged
round's name none, and its jobs run run.json's without reading a plan. A round run by lanes maps
lane descriptors instead, and starts its lanes afresh."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("airflow", reason="needs the airflow extra")

from airflow.sdk.exceptions import AirflowFailException

from airflow_batchinfer.operators import rounds, shard_jobs
from airflow_batchinfer.operators.rounds import GATE_PARAM, RoundControllerOperator, _descriptors, gate_params
from airflow_batchinfer.operators.shard_jobs import InferJudgeShardOperator
from airflow_batchinfer.run import jobs
from airflow_batchinfer.run.gate.changes import GATE_SCHEMAS
from airflow_batchinfer.run.lanes import claim_shard
from airflow_batchinfer.run.plan import propose_slot
from airflow_batchinfer.state.config import RunConfig, round_config
from airflow_batchinfer.state.docs import Plan, read_plan, write_plan
from airflow_batchinfer.state.docs.lanes import LaneDoc, claimed_shards, read_lanes, write_lane
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage.location import StorageOptions
from tests.support.fake_jobs import make_run, plan_round

SHARDS = [{"shard_id": f"part-0000{i}", "uri": f"/p/part-0000{i}.jsonl.zst", "records": 10} for i in range(2)]


@pytest.mark.parametrize(
    ("settings", "extra"), [(None, {}), ({}, {}), ({"temperature": 1.3}, {"slot": "round-01"})]
)
def test_a_descriptor_names_its_slot_only_when_a_review_changed_the_rounds_settings(
    settings: dict[str, float] | None, extra: dict[str, str]
) -> None:
    plan = Plan("round-01", 1, "rounds", list(SHARDS), settings=settings)  # type: ignore[arg-type]
    assert _descriptors(plan) == [{**s, "round": 1, **extra} for s in SHARDS]
    assert _descriptors(Plan("round-02", 2, "skip", list(SHARDS))) == []  # type: ignore[arg-type]


def test_an_unchanged_rounds_tasks_read_no_plan_and_a_changed_rounds_read_their_settings_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """plan.json holds every shard's descriptor (hundreds of KB at 1,000 shards): a task reads it
    only when its round runs other settings than run.json's."""
    cfg = make_run(tmp_path, sampling={"temperature": 0.7})
    reads: list[str] = []

    def counted(layout: RunLayout, slot: str, so: StorageOptions | None = None) -> Plan | None:
        reads.append(slot)
        return read_plan(layout, slot, so)

    monkeypatch.setattr(jobs, "read_plan", counted)
    monkeypatch.setattr(shard_jobs, "owned_run_config", lambda run_root, context, so=None: cfg)

    def task_configs(plan: Plan) -> list[RunConfig]:
        """What each mapped task of the round runs, as its ``execute`` and ``execute_complete`` read it."""
        return [
            InferJudgeShardOperator(
                task_id="t", shard=d, run_root=cfg.run_root, worker_pool="local://gpu"
            )._config({})
            for d in _descriptors(plan)
        ]

    plan = plan_round(cfg)
    assert plan.shards and all("slot" not in d for d in _descriptors(plan))
    assert task_configs(plan) == [cfg] * len(plan.shards) and reads == []
    plan.settings = {"temperature": 1.3}
    plan.config = round_config(cfg, plan.settings)
    write_plan(RunLayout(cfg.run_root), plan)
    assert [c.sampling for c in task_configs(plan)] == [{"temperature": 1.3}] * len(plan.shards)
    assert reads == ["round-00"] * len(plan.shards)


def test_the_gates_form_has_one_field_per_changeable_setting_with_its_schema() -> None:
    params = gate_params()
    assert set(params) == {GATE_PARAM.format(k) for k in GATE_SCHEMAS}
    for key, schema in GATE_SCHEMAS.items():
        param = params[GATE_PARAM.format(key)]
        assert param.value is None and {k: param.schema[k] for k in schema} == schema, key


def controller(cfg: RunConfig, **kwargs: Any) -> RoundControllerOperator:
    return RoundControllerOperator(task_id="plan", slot="round-00", run_root=cfg.run_root, **kwargs)


def test_a_round_of_lanes_maps_one_lane_per_pool_slot_never_more_than_its_shards(tmp_path: Path) -> None:
    cfg = make_run(tmp_path)  # three shards
    plan = propose_slot(cfg, "round-00").plan
    lanes = controller(cfg, map_lanes=True, slots="2")._mapped(cfg, plan)  # a template renders a str
    assert lanes == [{"slot": "round-00", "round": 0, "lane": i, "lanes": 2} for i in range(2)]
    assert len(controller(cfg, map_lanes=True, slots=8)._mapped(cfg, plan)) == 3  # an idle lane: no task
    asked = RunConfig(**{**cfg.to_dict(), "lanes": 1})  # the run setting wins over the slots
    assert (
        len(controller(cfg, map_lanes=True, slots=8)._mapped(asked, propose_slot(asked, "round-00").plan))
        == 1
    )
    skip = Plan("round-01", 1, "skip", list(SHARDS))  # type: ignore[arg-type]
    assert controller(cfg, map_lanes=True, slots=8)._mapped(cfg, skip) == []
    assert controller(cfg)._mapped(cfg, plan) == _descriptors(plan)  # a judge pool's DAG: per shard


def test_more_lanes_than_max_map_length_are_refused_with_the_remedy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = make_run(tmp_path)
    monkeypatch.setattr(rounds, "max_map_length", lambda: 2)
    plan = propose_slot(cfg, "round-00").plan
    with pytest.raises(AirflowFailException, match=r"3 lanes.*at most 2.*lanes to at most 2"):
        controller(cfg, map_lanes=True, slots=4)._commit(cfg, plan, {}, {})
    assert read_plan(RunLayout(cfg.run_root), "round-00") is None  # nothing stored


def test_planning_a_round_of_lanes_again_forgets_its_earlier_claims_and_lane_documents(
    tmp_path: Path,
) -> None:
    cfg = make_run(tmp_path)
    layout = RunLayout(cfg.run_root)
    plan = propose_slot(cfg, "round-00").plan
    sid = plan.shards[0]["shard_id"]
    assert claim_shard(layout, 0, sid, lane=0)
    write_lane(layout, LaneDoc(round=0, slot="round-00", lane=0, lanes=2, claiming=sid))
    lanes = controller(cfg, map_lanes=True, slots=2)._commit(cfg, plan, {}, {})
    assert len(lanes) == 2 and read_plan(layout, "round-00") == plan
    assert claimed_shards(layout, 0) == set() and read_lanes(layout, 0) == []
    # a DAG mapping per shard has no claims to forget: what is there stays
    assert claim_shard(layout, 0, sid, lane=0)
    controller(cfg)._commit(cfg, plan, {}, {})
    assert claimed_shards(layout, 0) == {sid}


class _EnginePool:
    """The pool client's one call ``_start`` makes: what the pool runs."""

    def __init__(self, engine: str) -> None:
        self.answer = {"engine": engine, "model": "m"}

    async def engine(self) -> dict[str, Any]:
        return self.answer

    async def aclose(self) -> None:
        pass


@pytest.mark.parametrize("where", ["run", "review"])
def test_a_round_whose_sampling_its_pools_engine_does_not_honour_fails_before_its_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    asked = {"presence_penalty": 0.5}  # OpenAI's additive penalty: not in transformers' generate()
    cfg = make_run(tmp_path, **({"sampling": asked} if where == "run" else {}))
    plan = propose_slot(cfg, "round-00").plan
    if where == "review":  # the plan's settings (what reviews changed) are what the round runs
        plan.config = dataclasses.replace(cfg, sampling=asked)
    op = controller(cfg)
    held = {"engine": None}  # the pool itself: the fake client below answers for it
    monkeypatch.setattr(RoundControllerOperator, "_hold_pools", lambda self, cfg, context, gate: held)
    engines = {"vllm": _EnginePool("vllm"), "transformers": _EnginePool("transformers")}
    monkeypatch.setattr(rounds.PoolClient, "for_pool", lambda pool, lease_id: engines[running])
    context: Any = {"dag": type("D", (), {"dag_id": "d"}), "run_id": "r"}
    running = "vllm"  # honours it: the round starts, recording what the pool runs
    op._start(cfg, plan, context)
    assert plan.engine == {"engine": "vllm", "model": "m"}
    running = "transformers"
    with pytest.raises(AirflowFailException, match=r"presence_penalty.*transformers"):
        op._start(cfg, plan, context)
