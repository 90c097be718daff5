"""The round controller: a round maps lane descriptors (one per pool slot, never more than its shards
nor Airflow's map length) and starts its lanes afresh; the review gate's form."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("airflow", reason="needs the airflow extra")

from airflow.sdk.exceptions import AirflowFailException

from airflow_batchinfer.operators import rounds
from airflow_batchinfer.operators.rounds import GATE_PARAM, RoundControllerOperator, gate_params
from airflow_batchinfer.run.gate.changes import GATE_SCHEMAS
from airflow_batchinfer.run.lanes import claim_shard
from airflow_batchinfer.run.plan import propose_slot
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import Plan, read_plan
from airflow_batchinfer.state.docs.lanes import LaneDoc, claimed_shards, read_lanes, write_lane
from airflow_batchinfer.state.layout import RunLayout
from tests.support.fake_jobs import make_run

SHARDS = [{"shard_id": f"part-0000{i}", "uri": f"/p/part-0000{i}.jsonl.zst", "records": 10} for i in range(2)]


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
    lanes = controller(cfg, slots="2")._mapped(cfg, plan)  # a template renders a str
    assert lanes == [{"slot": "round-00", "round": 0, "lane": i, "lanes": 2} for i in range(2)]
    assert len(controller(cfg, slots=8)._mapped(cfg, plan)) == 3  # an idle lane: no task
    asked = RunConfig.of(**{**cfg.to_dict(), "lanes": 1})  # the run setting wins over the slots
    assert len(controller(cfg, slots=8)._mapped(asked, propose_slot(asked, "round-00").plan)) == 1
    with pytest.raises(AirflowFailException, match=r"given no slots\. Remedy: pass slots="):
        controller(cfg)._mapped(cfg, plan)  # lanes 0 needs the pool's slots
    assert len(controller(asked)._mapped(asked, propose_slot(asked, "round-00").plan)) == 1
    skip = Plan(slot="round-01", round=1, mode="skip", shards=list(SHARDS))  # type: ignore[arg-type]
    assert controller(cfg, slots=8)._mapped(cfg, skip) == []


def test_more_lanes_than_max_map_length_are_refused_with_the_remedy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = make_run(tmp_path)
    monkeypatch.setattr(rounds, "max_map_length", lambda: 2)
    plan = propose_slot(cfg, "round-00").plan
    with pytest.raises(AirflowFailException, match=r"3 lanes.*at most 2.*lanes to at most 2"):
        controller(cfg, slots=4)._commit(cfg, plan, {}, {})
    assert read_plan(RunLayout(cfg.run_root), "round-00") is None  # nothing stored


def test_planning_a_round_of_lanes_again_forgets_its_earlier_claims_and_lane_documents(
    tmp_path: Path,
) -> None:
    cfg = make_run(tmp_path)
    layout = RunLayout(cfg.run_root)
    plan = propose_slot(cfg, "round-00").plan
    sid = plan.shards[0].shard_id
    assert claim_shard(layout, 0, sid, lane=0)
    write_lane(layout, LaneDoc(round=0, slot="round-00", lane=0, lanes=2, claiming=sid))
    lanes = controller(cfg, slots=2)._commit(cfg, plan, {}, {})
    assert len(lanes) == 2 and read_plan(layout, "round-00") == plan
    assert claimed_shards(layout, 0) == set() and read_lanes(layout, 0) == []


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
        plan.config = cfg.replace(sampling=asked)
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
