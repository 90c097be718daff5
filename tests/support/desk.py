"""The review desk's app in process, for a run that goes through its gates: Airflow's own api-server
app on a throwaway SQLite database (SimpleAuthManager users, tokens from ``POST /auth/token``), one
DAG run of the desk tests' DAG (plan tasks ``round_01.plan`` and ``tail.plan``) whose gates open and
are answered as the round controller leaves them. The desk tests' module fixtures (test_app,
test_focus_app, test_shards_app, test_calibration_app, test_desk_bounded) and bench/calibration.py
build on :func:`desk_app`."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.unit.review import test_app as t


@contextlib.contextmanager
def desk_app(home: Path) -> Iterator[t.Desk]:
    """The desk's app with the test DAG and its users (alice admin, bob viewer, carol and dave users);
    ``roots`` is filled by :func:`open_gate`."""
    from airflow import settings
    from airflow.api_fastapi import app as api_app
    from airflow.utils import db
    from airflow.utils.session import create_session
    from fastapi.testclient import TestClient

    from airflow_batchinfer.plugin.desk import get_app

    home.mkdir(parents=True, exist_ok=True)
    passwords = home / "passwords.json"
    passwords.write_text(json.dumps({u: f"pw-{u}" for u in t.USERS}))
    env = {
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__AUTH_MANAGER": (
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
        ),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:{r}" for u, r in t.USERS.items()),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__API_AUTH__JWT_SECRET": "review-desk-tests-" + "x" * 64,
        "AIRFLOW__API__SECRET_KEY": "review-desk-tests-" + "y" * 32,
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    settings.configure_vars()
    settings.reconfigure_orm()
    try:
        db.initdb()
        with create_session() as session:
            t._add_dag(session)
        api_app.purge_cached_app()
        get_app.cache_clear()
        client = TestClient(api_app.create_app())
        tokens = {}
        for user in t.USERS:
            r = client.post("/auth/token", json={"username": user, "password": f"pw-{user}"})
            assert r.status_code == 201, r.text
            tokens[user] = r.json()["access_token"]
        yield t.Desk(client, tokens, {})
    finally:
        api_app.purge_cached_app()
        get_app.cache_clear()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        settings.configure_vars()
        settings.reconfigure_orm()


def open_gate(desk: t.Desk, run_id: str, task_id: str, run_root: str, subject: str) -> None:
    """``task_id``'s review gate of DAG run ``run_id`` waits (the run is created at its first gate,
    its root claimed by it); the run's earlier gate, if any, was answered."""
    from airflow._shared.timezones import timezone
    from airflow.models.dagrun import DagRun
    from airflow.models.hitl import HITLDetail
    from airflow.models.renderedtifields import RenderedTaskInstanceFields
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState
    from airflow.utils.types import DagRunTriggeredByType, DagRunType
    from sqlalchemy import insert, select

    from airflow_batchinfer.state.owner import RunIdentity
    from tests.support.owners import write_owner

    with create_session() as session:
        run = session.scalar(select(DagRun).where(DagRun.dag_id == t.DAG_ID, DagRun.run_id == run_id))
        if run is None:
            dag = SerializedDagModel.get_dag(t.DAG_ID, session=session)
            run = dag.create_dagrun(
                run_id=run_id, run_after=timezone.utcnow(), run_type=DagRunType.MANUAL,
                triggered_by=DagRunTriggeredByType.TEST, state=DagRunState.RUNNING, session=session,
            )  # fmt: skip
            session.flush()
            write_owner(run_root, RunIdentity(t.DAG_ID, run_id))
            desk.roots[run_id] = run_root
        ti = next(x for x in run.get_task_instances(session=session) if x.task_id == task_id)
        ti.state = TaskInstanceState.AWAITING_INPUT
        session.merge(ti)
        session.execute(
            insert(RenderedTaskInstanceFields).values(
                dag_id=t.DAG_ID,
                task_id=task_id,
                run_id=run_id,
                map_index=-1,
                rendered_fields={"run_root": run_root, "aws_conn_id": None},
            )
        )
        session.add(
            HITLDetail(
                ti_id=ti.id,
                options=["Continue", "Continue in place", "Accept remaining as they are", "Stop"],
                subject=subject,
                body="the body",
                defaults=["Stop"],
                multiple=False,
                params={},
            )
        )


def answer_gate(run_id: str, task_id: str, choice: str, by: str = "alice") -> None:
    """Airflow records the gate's answer (the plan task then applies it: the caller does)."""
    from airflow._shared.timezones import timezone
    from airflow.models.hitl import HITLDetail
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from airflow.utils.state import TaskInstanceState
    from sqlalchemy import select

    with create_session() as session:
        ti = session.scalar(
            select(TaskInstance).where(
                TaskInstance.dag_id == t.DAG_ID,
                TaskInstance.run_id == run_id,
                TaskInstance.task_id == task_id,
            )
        )
        assert ti is not None
        detail: Any = session.scalar(select(HITLDetail).where(HITLDetail.ti_id == ti.id))
        detail.responded_at = timezone.utcnow()
        detail.responded_by = {"id": by, "name": by}
        detail.chosen_options = [choice]
        ti.state = TaskInstanceState.SUCCESS
