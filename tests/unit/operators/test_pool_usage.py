"""The pool setup and teardown record the run's lease as usage events (issue 40): the replicas and
GPUs leased, 0 at the release; only in a root this DAG run owns, and never failing the task."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("airflow", reason="needs the airflow extra")

from airflow_batchinfer.operators import pool as pool_ops
from airflow_batchinfer.operators.pool import PoolTeardownOperator, record_run_lease
from airflow_batchinfer.state.docs.usage import read_usage
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.state.owner import OWNER_VERSION, RunIdentity, owner_record, owner_uri
from airflow_batchinfer.storage.json_doc import write_json
from airflow_batchinfer.storage.location import resolve

ME = RunIdentity("d", "r1")


def _context(run_id: str = "r1") -> Any:
    return {"ti": SimpleNamespace(dag_id="d", run_id=run_id)}


def _owned(root: Path, me: RunIdentity = ME) -> str:
    write_json(resolve(owner_uri(str(root))), owner_record(me), schema_version=OWNER_VERSION)
    return str(root)


def _op(root: str | None) -> Any:
    return SimpleNamespace(run_root=root, aws_conn_id=None, log=SimpleNamespace(info=print, warning=print))


def test_the_setup_records_replicas_and_gpus(tmp_path: Path) -> None:
    root = _owned(tmp_path)
    record_run_lease(_op(root), _context(), "kubernetes://ns/llm", 4, gpus=2)
    record_run_lease(_op(root), _context(), "local://cpu", 1, gpus=0)  # a CPU pool: a replica is 1
    events = read_usage(RunLayout(root))
    assert [(e.kind, e.pool, e.replicas, e.gpus) for e in events] == [
        ("lease", "kubernetes://ns/llm", 4, 2.0),
        ("lease", "local://cpu", 1, 1.0),
    ]


def test_nothing_is_written_into_a_root_this_run_does_not_own(tmp_path: Path) -> None:
    other = _owned(tmp_path / "other", RunIdentity("d", "r0"))
    record_run_lease(_op(other), _context(), "local://p", 2)
    assert read_usage(RunLayout(other)) == []
    record_run_lease(_op(str(tmp_path / "empty")), _context(), "local://p", 2)  # never claimed
    assert not (tmp_path / "empty").exists()
    record_run_lease(_op(None), _context(), "local://p", 2)  # no run root rendered: nothing to do


def test_a_failed_write_is_logged_not_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _owned(tmp_path)

    def broken(*args: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("airflow_batchinfer.run.usage_events.record_usage", broken)
    record_run_lease(_op(root), _context(), "local://p", 2)  # no exception
    assert read_usage(RunLayout(root)) == []


class _Pool:
    backend = "local"

    def __str__(self) -> str:
        return "local://p"

    def release(self, lease: str, stop: bool = False) -> int:
        return 0


def test_the_teardown_records_the_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _owned(tmp_path)
    monkeypatch.setattr(pool_ops, "open_pool", lambda ref: _Pool())
    monkeypatch.setattr(pool_ops, "check_params", lambda *a, **k: None)
    context = {**_context(), "dag": SimpleNamespace(dag_id="d"), "run_id": "r1"}
    PoolTeardownOperator(task_id="pool_teardown", worker_pool="local://p", run_root=root).execute(context)
    [event] = read_usage(RunLayout(root))
    assert (event.kind, event.pool, event.replicas) == ("lease", "local://p", 0)
    # a run root with nothing in it: the teardown still releases, and writes nothing there
    empty = str(tmp_path / "nothing")
    PoolTeardownOperator(task_id="pool_teardown", worker_pool="local://p", run_root=empty).execute(context)
    assert not (tmp_path / "nothing").exists()
