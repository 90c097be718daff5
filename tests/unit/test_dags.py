"""The example DAGs and the factory: they import cleanly, have the documented shape and params, and
the first task refuses bad settings and too many shards with the remedy."""

from __future__ import annotations

import itertools
import json
from datetime import timedelta
from pathlib import Path

import pytest

pytest.importorskip("airflow", reason="needs the airflow extra")
pytestmark = pytest.mark.airflow

from airflow.dag_processing.dagbag import DagBag  # noqa: E402
from airflow.sdk.definitions.mappedoperator import MappedOperator  # noqa: E402
from airflow.sdk.exceptions import AirflowFailException  # noqa: E402

from airflow_batchinfer.dag_factory import DEFAULTS, JUDGE_POOL_DEFAULTS, build_batch_inference_dag  # noqa: E402
from airflow_batchinfer.operators.lanes import JudgeLanesOperator, ShardLaneOperator  # noqa: E402
from airflow_batchinfer.operators.pin import pinned_expr, pinned_param  # noqa: E402
from airflow_batchinfer.operators.shard import ShardDatasetOperator  # noqa: E402

DAGS = Path(__file__).parents[2] / "dags"


def test_example_dags_import_cleanly() -> None:
    bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {}
    assert set(bag.dags) == {
        "batchinfer_rounds_llm_judge", "batchinfer_in_place", "batchinfer_hybrid", "batchinfer_human_review",
    }  # fmt: skip
    review = bag.dags["batchinfer_human_review"]
    assert review.params["review"] == "every_round" and review.params["model"] == "builtin:smollm2"
    assert bag.dags["batchinfer_in_place"].params["strategy"] == "in_place"


def test_factory_shape_pools_and_params() -> None:
    """One mapped lane task per round slot (lanes, not shards); each lane runs its shards' jobs."""
    dag = build_batch_inference_dag(
        "shape", max_rounds=2, airflow_pool="gpu", execution_timeout=timedelta(hours=3)
    )
    assert set(dag.task_dict) == {
        "pin", "shard", "pool_setup", "report", "pool_teardown",
        "round_00.plan", "round_00.lanes", "round_00.close",
        "round_01.plan", "round_01.lanes", "round_01.close",
        "tail.plan", "tail.lanes", "tail.close",
    }  # fmt: skip
    for task_id in ("round_00.lanes", "round_01.lanes", "tail.lanes"):
        lanes = dag.task_dict[task_id]
        assert isinstance(lanes, MappedOperator) and lanes.operator_class is ShardLaneOperator
        assert lanes.pool == "gpu" and lanes.upstream_task_ids == {task_id.replace("lanes", "plan")}
        # a lane lasts as long as its round: the timeout bounds each of its jobs instead
        assert lanes.partial_kwargs["execution_timeout"] is None
        assert lanes.partial_kwargs["job_timeout"] == timedelta(hours=3)
    plan = dag.task_dict["round_00.plan"]
    assert plan.slots == pinned_expr("p['replicas'] * p['concurrency']")  # the params the pin task rendered
    assert dag.task_dict["shard"].slots == plan.slots  # round 0's last shards taper for its lanes
    assert dag.task_dict["round_00.close"].trigger_rule == "all_done"
    assert dag.task_dict["pool_setup"].is_setup and dag.task_dict["pool_teardown"].is_teardown
    # the first plan runs the pre-flight as soon as the input is planned and the pool is ready; the
    # pool is released beside the report, once the last round has closed
    plans = {t: dag.task_dict[f"{t}.plan"] for t in ("round_00", "round_01", "tail")}
    assert [p.preflight for p in plans.values()] == [True, False, False]
    assert plans["round_00"].upstream_task_ids == {"shard", "pool_setup"}
    # the pin task renders what every later task takes from the params: it runs first
    shard, setup = dag.task_dict["shard"], dag.task_dict["pool_setup"]
    assert shard.upstream_task_ids == setup.upstream_task_ids == {"pin"}
    assert dag.task_dict["pool_teardown"].upstream_task_ids == {"pool_setup", "tail.close"}
    assert dag.task_dict["report"].upstream_task_ids == {"tail.close"}
    assert set(dag.params) == set(DEFAULTS)
    schema = dag.params.get_param("max_rounds").schema
    assert schema["maximum"] == 2
    assert dag.params.get_param("strategy").schema["enum"] == ["rounds", "in_place", "hybrid"]


def test_factory_with_a_judge_pool_runs_its_rounds_by_lanes_too() -> None:
    """A judge with its own pool: the same lanes in the run's Airflow pool, and judge lanes beside them
    in the judge's (run.judge_lanes), mapped over what the slot's ``judge_plan`` task returns (one per
    judge pool slot); the judge pool's reference in the run's settings, and its own setup, teardown
    and params."""
    judge = {"judge": {"type": "llm"}}
    dag = build_batch_inference_dag("two", max_rounds=1, airflow_pool="gpu", judge_airflow_pool="judge",
                                    defaults=judge)  # fmt: skip
    assert set(dag.task_dict) == {
        "pin", "shard", "pool_setup", "judge_pool_setup", "report", "pool_teardown", "judge_pool_teardown",
        "round_00.plan", "round_00.lanes", "round_00.judge_plan", "round_00.judge_lanes", "round_00.close",
        "tail.plan", "tail.lanes", "tail.judge_plan", "tail.judge_lanes", "tail.close",
    }  # fmt: skip
    for slot in ("round_00", "tail"):
        lanes, judges = dag.task_dict[f"{slot}.lanes"], dag.task_dict[f"{slot}.judge_lanes"]
        assert isinstance(lanes, MappedOperator) and lanes.operator_class is ShardLaneOperator
        assert lanes.pool == "gpu" and lanes.partial_kwargs["worker_pool"] == pinned_param("worker_pool")
        assert isinstance(judges, MappedOperator) and judges.operator_class is ShardLaneOperator
        assert judges.pool == "judge" and judges.partial_kwargs["worker_pool"] == pinned_param("judge_pool")
        judge_plan = dag.task_dict[f"{slot}.judge_plan"]
        assert isinstance(judge_plan, JudgeLanesOperator) and judge_plan.slot == slot.replace("_", "-")
        assert judge_plan.judge_slots == pinned_expr("p['judge_replicas'] * p['judge_concurrency']")
        assert judge_plan.upstream_task_ids == {f"{slot}.plan"}
        (arg,) = judges.expand_input.value.values()
        assert arg.operator is judge_plan
        assert dag.task_dict[f"{slot}.close"].upstream_task_ids == {f"{slot}.lanes", f"{slot}.judge_lanes"}
    assert "'judge_pool': p['judge_pool']" in dag.task_dict["shard"].config  # a run setting, from the pin
    setup = dag.task_dict["judge_pool_setup"]
    assert setup.is_setup and dag.task_dict["judge_pool_teardown"].is_teardown
    assert (setup.worker_pool, setup.model) == (pinned_param("judge_pool"), pinned_param("judge_model"))
    assert dag.task_dict["round_00.plan"].upstream_task_ids == {"shard", "pool_setup", "judge_pool_setup"}
    assert dag.task_dict["judge_pool_teardown"].upstream_task_ids == {"judge_pool_setup", "tail.close"}
    assert set(dag.params) == set(DEFAULTS) | set(JUDGE_POOL_DEFAULTS)


def shard_op(tmp_path: Path, **config: object) -> ShardDatasetOperator:
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": i, "q": "x"}) + "\n" for i in range(25)))
    base = {"input": str(data), "run_root": str(tmp_path / "run"), "prompt_template": "{{ q }}",
            "judge": {"type": "llm"}, "records_per_shard": 5}  # fmt: skip
    return ShardDatasetOperator(task_id="shard", config={**base, **config}, slots="4")


def test_a_dag_of_lanes_takes_more_shards_than_max_map_length(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Its rounds map lanes, not shards: Airflow's map length bounds the lanes (the plan task)."""
    monkeypatch.setenv("AIRFLOW__CORE__MAX_MAP_LENGTH", "4")
    summary = shard_op(tmp_path).execute({})  # type: ignore[arg-type]
    assert summary["shards"] == 5


@pytest.mark.parametrize(
    ("slots", "lanes", "tapered_for"), [("4", 0, 4), ("4", 3, 3), ("4", 9, 4), (None, 0, 0)]
)
def test_the_inputs_last_shards_taper_for_round_0s_lanes(
    tmp_path: Path, slots: str | None, lanes: int, tapered_for: int
) -> None:
    """lanes 0: one per pool slot (replicas x concurrency); more lanes than slots: the slots; no
    slots given (a hand-built DAG): no taper."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": i, "q": "x"}) + "\n" for i in range(60_000)))
    cfg = {"input": str(data), "run_root": str(tmp_path / "run"), "prompt_template": "{{ q }}",
           "judge": {"type": "llm"}, "records_per_shard": 8_000, "lanes": lanes}  # fmt: skip
    op = ShardDatasetOperator(task_id="shard", config=cfg, slots=slots)
    summary = op.execute({})  # type: ignore[arg-type]
    manifest = json.loads((tmp_path / "run" / "input" / "_manifest.json").read_text())
    assert manifest["taper_lanes"] == tapered_for
    assert summary["shards"] == len(manifest["shards"])
    assert (summary["shards"] > 8) == bool(tapered_for)  # 60,000 / 8,000: 8 shards untapered
    assert summary["records"] == pytest.approx(60_000, rel=0.1)  # estimated from bytes


@pytest.mark.parametrize("slots", ["0", "-2", "four", "2.5"])
def test_bad_pool_slots_fail_the_shard_task_with_the_remedy(tmp_path: Path, slots: str) -> None:
    op = shard_op(tmp_path)
    op.slots = slots
    with pytest.raises(AirflowFailException, match="replicas and concurrency to positive whole numbers"):
        op.execute({})  # type: ignore[arg-type]


def test_shard_refuses_bad_settings_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(AirflowFailException, match="strategy 'fastest'"):
        shard_op(tmp_path, strategy="fastest").execute({})  # type: ignore[arg-type]
    with pytest.raises(AirflowFailException, match="invalid prompt template"):
        shard_op(tmp_path, prompt_template="{{ q ").execute({})  # type: ignore[arg-type]
    assert not (tmp_path / "run").exists()


def test_shard_plans_ranges_returns_a_summary_and_stores_the_settings(tmp_path: Path) -> None:
    summary = shard_op(tmp_path, records_per_shard=10).execute({})  # type: ignore[arg-type]
    # XCom: a summary; the refs are in the input's manifest (a 100k-part plan is megabytes)
    manifest = tmp_path / "run" / "input" / "_manifest.json"
    assert summary == {
        "shards": 3, "records": 25, "estimated": True, "manifest": str(manifest), "reused": False
    }  # fmt: skip
    shards = json.loads(manifest.read_text())["shards"]
    # byte ranges of the input at line starts (nothing copied): references, estimated record counts
    data = tmp_path / "data.jsonl"
    assert {s["uri"] for s in shards} == {str(data)} and all(s["estimated"] for s in shards)
    assert shards[0]["range"][0] == 0 and shards[-1]["range"][1] == data.stat().st_size
    assert all(a["range"][1] == b["range"][0] for a, b in itertools.pairwise(shards))
    assert sum(s["records"] for s in shards) == 25 and "ids" not in shards[0]  # ids: once read
    stored = json.loads((tmp_path / "run" / "run.json").read_text())
    assert stored["id_field"] == "id" and stored["records_per_shard"] == 10
