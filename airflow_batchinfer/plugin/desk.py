"""The review desk's app in Airflow's api-server (:func:`get_app`): the desk's routes
(:func:`airflow_batchinfer.review.app.create_app`) on Airflow's login, DAG permissions, database and
connections, which this module alone of the desk's imports:

- **Who**: ``get_user`` on the whole app (the UI's ``_token`` cookie or a Bearer token).
- **May read / may decide**: GET / PUT on the DAG's HITL details (``requires_access_dag``), and for
  a gate with ``assigned_users`` the auth manager's HITL check.
- **The gates**: HITL requests of plan tasks joined with their task instance and rendered fields
  (the way Airflow's own HITL routes join them).
- **Storage**: fsspec options from the plan task's AWS connection; the desk's caps from
  ``[batchinfer]`` in Airflow's configuration.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Collection
from typing import Any

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import (
    GetUserDep,
    auth_manager_from_app,
    get_user,
    requires_access_dag,
)
from airflow.configuration import conf
from airflow.models.dag import DagModel
from airflow.models.dagrun import DagRun
from airflow.models.hitl import HITLDetail
from airflow.models.renderedtifields import RenderedTaskInstanceFields as RTIF
from airflow.models.taskinstance import TaskInstance as TI
from airflow.utils.state import TaskInstanceState
from fastapi import FastAPI
from sqlalchemy import Row, Select, and_, select
from sqlalchemy.orm import Session

from airflow_batchinfer.hooks import aws
from airflow_batchinfer.review.app import create_app
from airflow_batchinfer.review.bounds import Bounds
from airflow_batchinfer.review.gate import PLAN_TASK, Gate
from airflow_batchinfer.review.routes.host import DeskHost
from airflow_batchinfer.spec.limit_settings import CONFIG_SECTION

__all__ = ["AirflowAccess", "create_desk", "get_app", "storage_options"]

OPEN_STATES = (TaskInstanceState.AWAITING_INPUT, TaskInstanceState.DEFERRED)
SO_TTL_S = 300.0  # how long storage options made from a connection are reused


class AirflowAccess:
    """A request's :class:`~airflow_batchinfer.review.routes.host.Access` in Airflow: its database
    session and signed-in user."""

    def __init__(self, session: Session, user: Any) -> None:
        self.session = session
        self.user = user

    @property
    def user_id(self) -> str:
        return str(self.user.get_id())

    @property
    def user_name(self) -> str:
        name = self.user.get_name() if hasattr(self.user, "get_name") else None
        return str(name or self.user.get_id())

    def gates(
        self, *, dag_id: str | None = None, run_id: str | None = None, open_only: bool = True
    ) -> list[Gate]:
        rows = self.session.execute(_gates_query(dag_id, run_id, open_only))
        return [_gate(row) for row in rows if PLAN_TASK.search(row.task_id)]

    def run_exists(self, dag_id: str, run_id: str) -> bool:
        found = self.session.scalar(select(DagRun.id).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
        return found is not None

    def readable(self, dag_ids: Collection[str]) -> set[str]:
        if not dag_ids:
            return set()
        teams = DagModel.get_dag_id_to_team_name_mapping(list(dag_ids), session=self.session)
        manager = get_auth_manager()
        return {
            d
            for d in dag_ids
            if manager.is_authorized_dag(
                method="GET",
                access_entity=DagAccessEntity.HITL_DETAIL,
                details=DagDetails(id=d, team_name=teams.get(d)),
                user=self.user,
            )
        }

    def may_respond(self, assigned_ids: set[str]) -> bool:
        return bool(get_auth_manager().is_authorized_hitl_task(assigned_users=assigned_ids, user=self.user))

    def storage_options(self, aws_conn_id: str | None) -> dict[str, Any]:
        return storage_options(aws_conn_id)

    def bounds(self) -> Bounds:
        """Read per request: cheap, and a bad value is a 409 that names the setting, not a desk that
        fails to load."""
        return Bounds.from_options(lambda name: conf.get(CONFIG_SECTION, name, fallback=None))


def _gates_query(dag_id: str | None, run_id: str | None, open_only: bool) -> Select[Any]:
    """HITL requests of plan tasks (``%.plan``) with their task instance and rendered fields, oldest
    first."""
    query = (
        select(
            HITLDetail.subject,
            HITLDetail.created_at,
            HITLDetail.assignees,
            HITLDetail.responded_at,
            TI.dag_id,
            TI.run_id,
            TI.task_id,
            TI.map_index,
            TI.state,
            RTIF.rendered_fields,
        )
        .select_from(HITLDetail)
        .join(TI, HITLDetail.ti_id == TI.id)
        .outerjoin(
            RTIF,
            and_(
                RTIF.dag_id == TI.dag_id,
                RTIF.run_id == TI.run_id,
                RTIF.task_id == TI.task_id,
                RTIF.map_index == TI.map_index,
            ),
        )
        .where(TI.task_id.like("%.plan"))
        .order_by(HITLDetail.created_at)
    )
    if open_only:
        query = query.where(HITLDetail.responded_at.is_(None), TI.state.in_(OPEN_STATES))
    if dag_id is not None:
        query = query.where(TI.dag_id == dag_id)
    if run_id is not None:
        query = query.where(TI.run_id == run_id)
    return query


def _gate(row: Row[Any]) -> Gate:
    return Gate(
        dag_id=row.dag_id,
        run_id=row.run_id,
        task_id=row.task_id,
        map_index=row.map_index,
        subject=row.subject,
        created_at=row.created_at,
        assigned_users=[
            {"id": str(u.get("id")), "name": str(u.get("name") or u.get("id"))}
            for u in (row.assignees or [])
            if isinstance(u, dict)
        ],
        state=str(row.state) if row.state is not None else None,
        open=row.responded_at is None and row.state in OPEN_STATES,
        rendered=row.rendered_fields if isinstance(row.rendered_fields, dict) else {},
    )


_so_cache: dict[str, tuple[float, dict[str, Any]]] = {}
_so_lock = threading.Lock()


def storage_options(aws_conn_id: str | None) -> dict[str, Any]:
    """fsspec options from the plan task's AWS connection (reused for a few minutes)."""
    if not aws_conn_id:
        return {}
    with _so_lock:
        hit = _so_cache.get(aws_conn_id)
        if hit and time.monotonic() - hit[0] < SO_TTL_S:
            return hit[1]
    so = aws.storage_options_from_aws_conn(aws_conn_id)
    with _so_lock:
        _so_cache[aws_conn_id] = (time.monotonic(), so)
    return so


def airflow_access(session: SessionDep, user: GetUserDep) -> AirflowAccess:
    return AirflowAccess(session, user)


def create_desk() -> FastAPI:
    """The desk's app on Airflow's login, permissions and database."""
    return create_app(
        DeskHost(
            user=get_user,
            access=airflow_access,
            read_dag=requires_access_dag("GET", DagAccessEntity.HITL_DETAIL),
            decide_dag=requires_access_dag("PUT", DagAccessEntity.HITL_DETAIL),
            # dependencies that read request.app.state.auth_manager would see this app's state
            overrides={auth_manager_from_app: get_auth_manager},
        )
    )


@functools.cache
def get_app() -> FastAPI:
    """The one app of this process (the plugin asks for it on every plugin load)."""
    return create_desk()
