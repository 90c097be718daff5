"""Who owns a run root: the pure decision, and the claim around it: a compare-and-swap on local disk
and the real S3 server (a store without conditional writes is refused:
tests/component/storage/test_unsafe_stores.py; another DAG's root: tests/unit/run/test_run_root_ownership.py).
The owner run's state comes from a dict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.exceptions import ConfigError, StorageError
from airflow_batchinfer.state.owner import (
    CREATOR,
    OWNER_VERSION,
    OwnedElsewhere,
    RunIdentity,
    claim,
    decide,
    owner_uri,
    read_owner,
    verify_owner,
)
from tests.support.owners import write_owner

ME = RunIdentity("llm_eval", "manual__2025-01-02T00:00:00+00:00")
OTHER = RunIdentity("llm_eval", "manual__2025-01-01T00:00:00+00:00")


def record(run: RunIdentity) -> dict[str, object]:
    return {"schema_version": OWNER_VERSION, "dag_id": run.dag_id, "run_id": run.run_id, CREATOR: run.dag_id}


# ------------------------------------------------------------------------------------- decide
def test_no_owner_is_claimed() -> None:
    d = decide(None, ME, None)
    assert d.action == "claim" and d.owner is None


def test_the_same_dag_run_keeps_it_whatever_its_state() -> None:
    # a retry of the shard task, or the DAG run cleared and re-run: same dag_id and run_id
    for state in (None, "queued", "running", "success", "failed"):
        d = decide(record(ME), ME, state)
        assert d.action == "keep" and d.owner == ME


@pytest.mark.parametrize("state", ["queued", "running", "RUNNING"])
def test_a_live_owner_refuses_with_the_remedy(state: str) -> None:
    d = decide(record(OTHER), ME, state, run_root="s3://b/runs/eval")
    assert d.action == "refuse" and d.owner == OTHER
    assert "s3://b/runs/eval belongs to DAG run llm_eval/manual__2025-01-01" in d.reason
    assert "another run_name" in d.reason and "wait until" in d.reason and "mark it failed" in d.reason


@pytest.mark.parametrize("state", ["success", "failed"])
def test_a_finished_owner_is_taken_over(state: str) -> None:
    d = decide(record(OTHER), ME, state)
    assert d.action == "claim" and d.owner == OTHER and state in d.reason


def test_an_owner_that_no_longer_exists_is_taken_over() -> None:
    d = decide(record(OTHER), ME, None)
    assert d.action == "claim" and "no longer exists" in d.reason


def test_another_dag_with_the_same_run_id_is_another_owner() -> None:
    d = decide(record(RunIdentity("other_dag", ME.run_id)), ME, "running")
    assert d.action == "refuse"


def test_airflow_state_enums_are_understood() -> None:
    from enum import Enum

    class DagRunState(str, Enum):  # noqa: UP042 - as Airflow defines it
        RUNNING = "running"
        SUCCESS = "success"

    assert decide(record(OTHER), ME, DagRunState.RUNNING).action == "refuse"  # type: ignore[arg-type]
    d = decide(record(OTHER), ME, DagRunState.RUNNING)  # type: ignore[arg-type]
    assert "which is running" in d.reason
    assert decide(record(OTHER), ME, DagRunState.SUCCESS).action == "claim"  # type: ignore[arg-type]


def test_an_unknown_state_is_refused_not_guessed() -> None:
    assert decide(record(OTHER), ME, "restarting").action == "refuse"


def test_a_record_naming_no_run_is_an_error() -> None:
    with pytest.raises(ConfigError, match="names no DAG run"):
        decide({"schema_version": 2, "dag_id": "x"}, ME, None)


# -------------------------------------------------------------------------------------- claim
class States:
    """DAG run states as the task SDK would report them; records which runs were asked about."""

    def __init__(self, **states: str) -> None:
        self.states = states
        self.asked: list[RunIdentity] = []

    def __call__(self, run: RunIdentity) -> str | None:
        self.asked.append(run)
        return self.states.get(run.run_id)


def test_claim_writes_a_versioned_record_and_a_rerun_keeps_it(tmp_path: Path) -> None:
    root = str(tmp_path / "run")
    states = States()
    d = claim(root, ME, states, extra={"try_number": 1})
    assert d.action == "claim" and states.asked == []
    stored = json.loads((tmp_path / "run" / "owner.json").read_text())
    assert stored["schema_version"] == OWNER_VERSION
    assert (stored["dag_id"], stored["run_id"], stored["try_number"]) == (ME.dag_id, ME.run_id, 1)
    assert stored["previous"] is None and stored["claimed_at"] and stored[CREATOR] == ME.dag_id
    before = (tmp_path / "run" / "owner.json").stat().st_mtime_ns
    assert claim(root, ME, states).action == "keep" and states.asked == []
    assert (tmp_path / "run" / "owner.json").stat().st_mtime_ns == before  # a re-run writes nothing


def test_claim_refuses_a_live_owner_and_leaves_its_record_as_it_was(tmp_path: Path) -> None:
    root = str(tmp_path / "run")
    write_owner(root, OTHER)
    before = (tmp_path / "run" / "owner.json").read_bytes()
    states = States(**{OTHER.run_id: "running"})
    d = claim(root, ME, states)
    assert d.action == "refuse" and states.asked == [OTHER]
    assert (tmp_path / "run" / "owner.json").read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [".owner.json.lock", "owner.json"]


def test_claim_takes_over_a_finished_owner_and_remembers_it(tmp_path: Path) -> None:
    root = str(tmp_path / "run")
    write_owner(root, OTHER)
    d = claim(root, ME, States(**{OTHER.run_id: "success"}))
    assert d.action == "claim"
    stored = read_owner(root)
    assert stored is not None and stored["run_id"] == ME.run_id
    assert stored["previous"] == {"dag_id": OTHER.dag_id, "run_id": OTHER.run_id}


def test_an_unreadable_or_foreign_record_is_an_error_with_the_remedy(tmp_path: Path) -> None:
    root = tmp_path / "run"
    root.mkdir()
    (root / "owner.json").write_text("{not json")
    with pytest.raises(StorageError, match=r"unreadable run owner record.*delete it"):
        claim(str(root), ME, States())
    (root / "owner.json").write_text(json.dumps({"schema_version": 2, "run_id": "x"}))
    with pytest.raises(ConfigError, match=r"owner\.json: the owner record names no DAG run.*delete it"):
        claim(str(root), ME, States())
    (root / "owner.json").write_text(json.dumps({"schema_version": 2, "dag_id": "d", "run_id": "x"}))
    with pytest.raises(ConfigError, match=r"owner\.json: the owner record names no creating DAG.*delete it"):
        claim(str(root), ME, States())
    for version in (1, 3):  # 1: an earlier pre-release's, without its creator
        doc = {"schema_version": version, "dag_id": "d", "run_id": "x"}
        (root / "owner.json").write_text(json.dumps(doc))
        with pytest.raises(StorageError, match=rf"schema_version {version} is not supported \(expected 2\)"):
            claim(str(root), ME, States())
    assert owner_uri(str(root)).endswith("/run/owner.json")


def test_later_tasks_verify_the_owner(tmp_path: Path) -> None:
    root = str(tmp_path / "run")
    verify_owner(root, ME)  # no record (a root `batchinfer run` made): nothing to check
    write_owner(root, ME)
    verify_owner(root, ME)
    with pytest.raises(
        OwnedElsewhere, match=r"belongs to DAG run llm_eval/manual__2025-01-02.*not to this run"
    ):
        verify_owner(root, OTHER)


# ------------------------------------------------------------------------- the shard task uses it
class FakeTI:
    """What the shard task reads from its task instance: its run, and other runs' states."""

    def __init__(self, run: RunIdentity, states: dict[str, str]) -> None:
        self.dag_id, self.run_id, self.try_number = run.dag_id, run.run_id, 1
        self.states = states

    def get_dagrun_state(self, dag_id: str, run_id: str) -> str:
        return self.states[run_id]


def shard_task(tmp_path: Path) -> object:
    pytest.importorskip("airflow", reason="needs the airflow extra")
    from airflow_batchinfer.operators.shard import ShardDatasetOperator

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": i, "q": "x"}) + "\n" for i in range(12)))
    config = {"input": str(data), "run_root": str(tmp_path / "run"), "prompt_template": "{{ q }}",
              "judge": {"type": "llm"}, "records_per_shard": 5}  # fmt: skip
    return ShardDatasetOperator(task_id="shard", config=config)


def test_the_shard_task_claims_then_refuses_another_live_run(tmp_path: Path) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    op: Any = shard_task(tmp_path)
    summary = op.execute({"ti": FakeTI(OTHER, {})})
    assert (summary["shards"], summary["records"]) == (3, 12)  # estimated per byte range
    assert read_owner(str(tmp_path / "run"))["run_id"] == OTHER.run_id  # type: ignore[index]
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "run").rglob("*")}
    with pytest.raises(
        AirflowFailException, match=r"belongs to DAG run llm_eval/manual__2025-01-01.*is running"
    ):
        op.execute({"ti": FakeTI(ME, {OTHER.run_id: "running"})})
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "run").rglob("*")} == before  # nothing touched
    resumed = op.execute({"ti": FakeTI(ME, {OTHER.run_id: "success"})})  # a finished owner: resumed
    assert resumed == {**summary, "reused": True}
    stored = read_owner(str(tmp_path / "run"))
    assert (
        stored is not None and stored["run_id"] == ME.run_id and stored["previous"]["run_id"] == OTHER.run_id
    )


def test_a_later_task_of_another_run_fails_without_touching_the_root(tmp_path: Path) -> None:
    pytest.importorskip("airflow", reason="needs the airflow extra")
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_batchinfer.state.owner import task_owns

    root = str(tmp_path / "run")
    write_owner(root, OTHER)
    task_owns(root, {"ti": FakeTI(OTHER, {})})
    task_owns(root, {})  # outside a DAG run
    with pytest.raises(AirflowFailException, match="not to this run"):
        task_owns(root, {"ti": FakeTI(ME, {})})
