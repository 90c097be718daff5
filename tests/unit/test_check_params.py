"""Issue 14, item 1: where a task gathers the limits: the provider's config section and the pool
connection the params name (its type and its extra). No Airflow running: the connection lookup is
replaced at its seam."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("airflow", reason="needs the airflow extra")

from airflow.sdk.exceptions import AirflowFailException, AirflowNotFoundException

from airflow_batchinfer.operators import limits as gather
from airflow_batchinfer.spec.limits import TriggerLimits

pytestmark = pytest.mark.security

DAG = TriggerLimits(allowed_input_prefixes=("/data/in.jsonl",), allowed_output_prefixes=("/data/runs",),
                    allowed_worker_pools=("local://batchinfer",))  # fmt: skip
CONNECTIONS = {
    "gpu_pool": SimpleNamespace(conn_type="batchinfer_pool",
                                extra_dejson={"backend": "kubernetes", "pool": "p",
                                              "allowed_input_prefixes": "s3://datasets/"}),
    "aws_default": SimpleNamespace(conn_type="aws", extra_dejson={"allowed_input_prefixes": "/"}),
}  # fmt: skip


@pytest.fixture(autouse=True)
def connections(monkeypatch: pytest.MonkeyPatch) -> None:
    def get_connection(conn_id: str) -> Any:
        if conn_id not in CONNECTIONS:
            raise AirflowNotFoundException(f"The conn_id `{conn_id}` isn't defined")
        return CONNECTIONS[conn_id]

    monkeypatch.setattr(gather.BaseHook, "get_connection", staticmethod(get_connection))


def check(**params: Any) -> TriggerLimits:
    return gather.check_params({"params": {"output_root": "/data/runs", **params}}, DAG)  # type: ignore[arg-type]


def test_a_pool_connection_widens_for_runs_on_it() -> None:
    assert (
        check(input="s3://datasets/a.jsonl", worker_pool="gpu_pool").allowed_input_prefixes[-1]
        == "s3://datasets/"
    )
    with pytest.raises(AirflowFailException, match="outside"):
        check(input="s3://datasets/a.jsonl", worker_pool="local://batchinfer")


def test_a_connection_of_another_type_is_not_a_pool_and_widens_nothing() -> None:
    with pytest.raises(AirflowFailException) as err:
        check(input="/etc/passwd", worker_pool="aws_default")
    assert "'aws_default' is not the DAG's pool" in str(err.value) and "'/etc/passwd' is outside" in str(
        err.value
    )
    with pytest.raises(AirflowFailException, match="'nope': no such connection"):
        check(input="/data/in.jsonl", worker_pool="nope")


def test_the_config_section_widens_every_dag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__BATCHINFER__ALLOWED_INPUT_PREFIXES", "/srv/data/, /srv/more/")
    monkeypatch.setenv("AIRFLOW__BATCHINFER__MAX_REPLICAS", "None")  # unset, as written out
    limits = check(input="/srv/more/x.jsonl", worker_pool="local://batchinfer", replicas=50)
    assert limits.max_replicas is None and "/srv/data/" in limits.allowed_input_prefixes
    monkeypatch.setenv("AIRFLOW__BATCHINFER__MAX_REPLICAS", "4")
    with pytest.raises(AirflowFailException, match="replicas 50 is more than max_replicas 4"):
        check(input="/srv/more/x.jsonl", worker_pool="local://batchinfer", replicas=50)
    assert json.dumps(limits.to_dict())  # limits are plain data


def test_pool_setup_lets_workers_read_the_allowed_input_prefixes_not_each_runs_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Round 0 reads the input in place, so the workers may read the allowed input prefixes: the
    deployment's list, the same for every run, so a run on another file keeps the warm pool's spec."""
    from airflow_batchinfer.operators.pool import PoolSetupOperator

    seen: list[list[str]] = []

    class Started(Exception):
        pass

    def local_up(self: PoolSetupOperator, *args: Any) -> None:  # the seam: record the spec, start nothing
        seen.append(self.allowed_prefixes)
        raise Started

    monkeypatch.setattr(PoolSetupOperator, "_local_up", local_up)
    wide = DAG.widen(TriggerLimits(allowed_input_prefixes=("/data/inputs",)))
    for data in ("/data/inputs/a.jsonl", "/data/inputs/b.jsonl"):
        op = PoolSetupOperator(task_id="pool_setup", worker_pool="local://batchinfer", limits=wide,
                               allowed_prefixes=["/data/runs"])  # fmt: skip
        params = {"output_root": "/data/runs", "input": data, "worker_pool": "local://batchinfer"}
        with pytest.raises(Started):
            op.execute({"params": params})  # type: ignore[arg-type]
    assert seen == [["/data/runs", "/data/in.jsonl", "/data/inputs"]] * 2


def test_a_judge_pool_connection_widens_only_the_judge_pools_settings() -> None:
    """Naming an admin's pool connection as ``judge_pool`` must not lend its input prefixes (or
    anything else) to the run: its extra widens the judge pool's own settings only."""
    CONNECTIONS["judge_conn"] = SimpleNamespace(
        conn_type="batchinfer_pool",
        extra_dejson={"backend": "kubernetes", "pool": "j", "allowed_input_prefixes": "/",
                      "allowed_models": "/models/"},
    )  # fmt: skip
    try:
        with pytest.raises(AirflowFailException, match="'/etc/passwd' is outside"):
            check(input="/etc/passwd", worker_pool="local://batchinfer", judge_pool="judge_conn")
        # the judge pool's own model is within its connection's limits
        check(input="/data/in.jsonl", worker_pool="local://batchinfer", judge_pool="judge_conn",
              judge_model="/models/70b")  # fmt: skip
        with pytest.raises(AirflowFailException, match="judge pool: model '/models/70b'"):
            check(input="/data/in.jsonl", worker_pool="gpu_pool", judge_pool="local://batchinfer",
                  judge_model="/models/70b")  # fmt: skip
        with pytest.raises(AirflowFailException, match="is the run's own worker_pool"):
            check(input="/data/in.jsonl", worker_pool="local://batchinfer", judge_pool="local://batchinfer")
    finally:
        del CONNECTIONS["judge_conn"]


def test_the_params_checked_are_those_the_task_runs_with() -> None:
    """Issue 37 item 9: the first tasks run with the params the run's ``pin`` task rendered, and check
    those, not the context's (the DAG file as it is when the task starts, which may say otherwise)."""
    allowed = {"input": "/data/in.jsonl", "output_root": "/data/runs", "worker_pool": "local://batchinfer"}
    context: Any = {"params": allowed}
    gather.check_params(context, DAG)
    with pytest.raises(AirflowFailException, match="'/etc/passwd' is outside"):
        gather.check_params(context, DAG, params={**allowed, "input": "/etc/passwd"})
