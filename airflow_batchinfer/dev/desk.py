"""The review desk's app in process, for tests and ``bench/calibration.py``: Airflow's own api-server
app on a throwaway SQLite database (SimpleAuthManager users, tokens from ``POST /auth/token``), one
DAG of plan tasks ``round_01.plan`` and ``tail.plan`` whose review gates open
(:func:`open_gate`) and are answered (:func:`answer_gate`) as the round controller leaves them. Needs
the ``airflow`` extra; nothing here runs in a deployment."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_batchinfer.state.owner import RunIdentity, claim

if TYPE_CHECKING:
    from fastapi.testclient import TestClient

DAG_ID = "desk"
USERS = {"alice": "admin", "bob": "viewer", "carol": "user", "dave": "user"}


@dataclass
class Desk:
    client: TestClient
    tokens: dict[str, str]
    roots: dict[str, str]

    def get(self, user: str | None, path: str, headers: dict[str, str] | None = None, **kwargs: Any) -> Any:
        return self.client.get(path, headers={**self._auth(user), **(headers or {})}, **kwargs)

    def post(self, user: str | None, path: str, body: Any) -> Any:
        return self.client.post(path, headers=self._auth(user), json=body)

    def _auth(self, user: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[user]}"} if user else {}


@contextlib.contextmanager
def desk_app(home: Path) -> Iterator[Desk]:
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
    passwords.write_text(json.dumps({u: f"pw-{u}" for u in USERS}))
    env = {
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__AUTH_MANAGER": (
            "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
        ),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:{r}" for u, r in USERS.items()),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__API_AUTH__JWT_SECRET": "review-desk-tests-" + "x" * 64,
        "AIRFLOW__API__SECRET_KEY": "review-desk-tests-" + "y" * 32,
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    settings.configure_vars()  # type: ignore[no-untyped-call]
    settings.reconfigure_orm()  # type: ignore[no-untyped-call]
    try:
        db.initdb()
        with create_session() as session:
            _add_dag(session)
        api_app.purge_cached_app()
        get_app.cache_clear()
        client = TestClient(api_app.create_app())
        tokens = {}
        for user in USERS:
            r = client.post("/auth/token", json={"username": user, "password": f"pw-{user}"})
            assert r.status_code == 201, r.text
            tokens[user] = r.json()["access_token"]
        yield Desk(client, tokens, {})
    finally:
        api_app.purge_cached_app()
        get_app.cache_clear()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        settings.configure_vars()  # type: ignore[no-untyped-call]
        settings.reconfigure_orm()  # type: ignore[no-untyped-call]


def open_gate(desk: Desk, run_id: str, task_id: str, run_root: str, subject: str) -> None:
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

    with create_session() as session:
        run = session.scalar(select(DagRun).where(DagRun.dag_id == DAG_ID, DagRun.run_id == run_id))
        if run is None:
            dag = SerializedDagModel.get_dag(DAG_ID, session=session)
            if dag is None:
                raise RuntimeError(f"no DAG {DAG_ID} in the database: open gates within desk_app()")
            run = dag.create_dagrun(
                run_id=run_id, run_after=timezone.utcnow(), run_type=DagRunType.MANUAL,
                triggered_by=DagRunTriggeredByType.TEST, state=DagRunState.RUNNING, session=session,
            )  # fmt: skip
            session.flush()
            claim(run_root, RunIdentity(DAG_ID, run_id), lambda _run: None)  # a new root: no owner yet
            desk.roots[run_id] = run_root
        ti = next(x for x in run.get_task_instances(session=session) if x.task_id == task_id)
        ti.state = TaskInstanceState.AWAITING_INPUT
        session.merge(ti)
        session.execute(
            insert(RenderedTaskInstanceFields).values(
                dag_id=DAG_ID,
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
                TaskInstance.dag_id == DAG_ID,
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


def _add_dag(session: Any) -> None:
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
    from airflow.models.dagbundle import DagBundleModel
    from airflow.sdk import DAG, TaskGroup

    from airflow_batchinfer.operators.rounds import RoundControllerOperator

    with DAG(DAG_ID, schedule=None) as dag:
        for slot in ("round-01", "tail"):
            with TaskGroup(slot.replace("-", "_")):
                RoundControllerOperator(task_id="plan", slot=slot, run_root="{{ params.root }}")
    session.add(DagBundleModel(name="testing"))
    session.flush()
    bag = DagBag(dag_folder=os.devnull)
    bag.bag_dag(dag)
    sync_bag_to_db(bag, "testing", None, session=session)
