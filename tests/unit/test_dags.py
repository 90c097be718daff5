"""The example DAGs and the factory: they import cleanly, have the documented shape and params, and
the first task refuses bad settings and too many shards with the remedy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("airflow", reason="needs the airflow extra")
pytestmark = pytest.mark.airflow

from airflow.dag_processing.dagbag import DagBag  # noqa: E402
from airflow.sdk.exceptions import AirflowFailException  # noqa: E402

from airflow_batchinfer.dag_factory import DEFAULTS, build_batch_inference_dag  # noqa: E402
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
    dag = build_batch_inference_dag("shape", max_rounds=2, airflow_pool="gpu")
    assert set(dag.task_dict) == {
        "shard", "pool_setup", "preflight", "report", "pool_teardown",
        "round_00.plan", "round_00.infer", "round_00.judge", "round_00.close",
        "round_01.plan", "round_01.infer", "round_01.judge", "round_01.close",
        "tail.plan", "tail.in_place", "tail.close",
    }  # fmt: skip
    for task_id in ("round_00.infer", "round_01.judge", "tail.in_place"):
        assert dag.task_dict[task_id].pool == "gpu"
    assert dag.task_dict["round_00.judge"].trigger_rule == "all_done"
    assert dag.task_dict["round_00.close"].trigger_rule == "all_done"
    assert dag.task_dict["pool_setup"].is_setup and dag.task_dict["pool_teardown"].is_teardown
    assert set(dag.params) == set(DEFAULTS)
    schema = dag.params.get_param("max_rounds").schema
    assert schema["maximum"] == 2
    assert dag.params.get_param("strategy").schema["enum"] == ["rounds", "in_place", "hybrid"]


def shard_op(tmp_path: Path, **config: object) -> ShardDatasetOperator:
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": i, "q": "x"}) + "\n" for i in range(25)))
    base = {"input": str(data), "run_root": str(tmp_path / "run"), "prompt_template": "{{ q }}",
            "judge": {"type": "llm"}, "records_per_shard": 5}  # fmt: skip
    return ShardDatasetOperator(task_id="shard", config={**base, **config}, max_map_length=4)


def test_shard_refuses_more_shards_than_max_map_length(tmp_path: Path) -> None:
    with pytest.raises(AirflowFailException, match=r"5 shards.*allows 4.*records_per_shard to at least 7"):
        shard_op(tmp_path).execute({})  # type: ignore[arg-type]


def test_shard_refuses_bad_settings_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(AirflowFailException, match="strategy 'fastest'"):
        shard_op(tmp_path, strategy="fastest").execute({})  # type: ignore[arg-type]
    with pytest.raises(AirflowFailException, match="invalid prompt template"):
        shard_op(tmp_path, prompt_template="{{ q ").execute({})  # type: ignore[arg-type]
    assert not (tmp_path / "run").exists()


def test_shard_returns_descriptors_and_stores_the_settings(tmp_path: Path) -> None:
    shards = shard_op(tmp_path, records_per_shard=10).execute({})  # type: ignore[arg-type]
    assert [s["records"] for s in shards] == [10, 10, 5]
    assert set(shards[0]) == {"shard_id", "uri", "records", "ids"}  # references and id digests
    stored = json.loads((tmp_path / "run" / "run.json").read_text())
    assert stored["id_field"] == "id" and stored["records_per_shard"] == 10
