"""Issue 37 item 9: a DAG file redeployed mid-run does not reach a live run. A worker renders a task's
templates from the DAG file as it is when the task starts; the run's first task (``pin``) renders the
run root, the pools' settings and the run settings once, and every later task renders them from its
XCom. Rendered here with the DAG objects and a fake task context, no Airflow server."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("airflow", reason="needs the airflow extra")
pytestmark = [pytest.mark.airflow, pytest.mark.security]

import croniter  # noqa: E402,F401  (a DAG imports it; its import runs `file` once: not inside the test)
from airflow.sdk import DAG  # noqa: E402
from airflow.sdk.definitions.mappedoperator import MappedOperator  # noqa: E402

from airflow_batchinfer.dag_factory import build_batch_inference_dag  # noqa: E402

RUN_ID = "manual__2026-12-07T10:00:00+00:00"
FIRST = {"output_root": "/data/runs", "worker_pool": "local://first", "replicas": 2, "concurrency": 3,
         "engine": "simulated", "model": None, "idle_ttl_s": 60, "records_per_shard": 10,
         "judge_pool": "local://judge-first", "judge_replicas": 1, "judge_concurrency": 2}  # fmt: skip
# the same DAG redeployed while the run is live: every default the tasks render is another
REDEPLOYED = {"output_root": "/elsewhere/runs", "worker_pool": "local://second", "replicas": 5,
              "concurrency": 7, "engine": "transformers", "model": "/models/m", "idle_ttl_s": 5,
              "records_per_shard": 99, "judge_pool": "local://judge-second", "judge_replicas": 4,
              "judge_concurrency": 4}  # fmt: skip


class _ParamsRead(AssertionError):
    pass


class _NoParams(dict[str, Any]):
    """Params a later task must not read: the DAG file's, which may have changed since the run began."""

    def __getitem__(self, name: str) -> Any:
        raise _ParamsRead(f"params.{name}")

    def __getattr__(self, name: str) -> Any:
        raise _ParamsRead(f"params.{name}")


class _TI:
    def __init__(self, xcoms: dict[str, Any]) -> None:
        self.xcoms = xcoms

    def xcom_pull(self, task_ids: str | None = None, key: str = "return_value", **_: Any) -> Any:
        assert key == "return_value" and task_ids is not None
        return self.xcoms.get(task_ids)


def _dag(defaults: dict[str, Any]) -> DAG:
    return build_batch_inference_dag(
        "pinned", max_rounds=2, judge_airflow_pool="judge", defaults={**defaults, "judge": {"type": "llm"}}
    )


def _fields(dag: DAG, task_id: str, params: Any, pin: dict[str, Any] | None) -> dict[str, Any]:
    """The task's templated fields rendered as a worker would, with ``params`` and the pin's XCom."""
    task = dag.task_dict[task_id]
    renderer = dag.task_dict["pin"]  # any operator renders a value with the DAG's (native) environment
    raw = task.partial_kwargs if isinstance(task, MappedOperator) else vars(task)
    context = {"params": params, "run_id": RUN_ID, "ti": _TI({"pin": pin})}
    env = dag.get_template_env()
    return {
        name: renderer.render_template(raw[name], context, env)  # type: ignore[arg-type]
        for name in task.template_fields
        if name in raw  # a mapped task's expanded field (the lane) comes from its plan's XCom
    }


def test_a_redeployed_dag_file_does_not_reach_a_live_run() -> None:
    before, after = _dag(FIRST), _dag(REDEPLOYED)
    assert set(before.task_dict) == set(after.task_dict)
    # the run's first task renders from the DAG file as it was when the run began
    pin, params = before.task_dict["pin"], before.params.validate()
    pin.run_root = _fields(before, "pin", params, None)["run_root"]  # type: ignore[attr-defined]
    pinned = pin.execute({"params": params})  # type: ignore[arg-type]
    root = "/data/runs/manual__2026-12-07T10-00-00-00-00"
    assert pinned == {"params": params, "run_root": root}
    for task_id in before.task_dict:
        if task_id == "pin":
            continue
        # every later task, parsed from the redeployed file: never the params, only the pin's values
        rendered = _fields(after, task_id, _NoParams(), pinned)
        assert rendered == _fields(before, task_id, _NoParams(), pinned), task_id
        if "run_root" in rendered:
            assert rendered["run_root"] == root, task_id
    setup = _fields(after, "pool_setup", _NoParams(), pinned)
    assert (setup["worker_pool"], setup["replicas"], setup["concurrency"]) == ("local://first", 2, 3)
    assert (setup["engine"], setup["idle_ttl_s"], setup["allowed_prefixes"]) == (
        "simulated",
        60,
        ["/data/runs"],
    )
    assert _fields(after, "judge_pool_setup", _NoParams(), pinned)["worker_pool"] == "local://judge-first"
    lanes = _fields(after, "round_00.lanes", _NoParams(), pinned)
    assert (lanes["worker_pool"], lanes["run_root"]) == ("local://first", root)
    assert _fields(after, "round_00.judge_lanes", _NoParams(), pinned)["worker_pool"] == "local://judge-first"
    assert _fields(after, "round_00.plan", _NoParams(), pinned)["slots"] == 6
    assert _fields(after, "tail.judge_plan", _NoParams(), pinned)["judge_slots"] == 2
    shard = _fields(after, "shard", _NoParams(), pinned)
    assert shard["config"]["records_per_shard"] == 10 and shard["config"]["run_root"] == root
    assert shard["config"]["judge_pool"] == "local://judge-first" and shard["slots"] == 6
    assert shard["run_params"] == params  # what shard checks against the limits: the params it runs with
    assert _fields(after, "pool_teardown", _NoParams(), pinned)["worker_pool"] == "local://first"
