"""The desk's seam to the server it runs in: what the routes ask of Airflow, given to the app builder
(:func:`airflow_batchinfer.review.app.create_app`) as FastAPI dependencies in a :class:`DeskHost`.

The routes name the placeholders below (:func:`access`, :data:`ReadDag`, :data:`DecideDag`); the
builder overrides each with the host's own (``app.dependency_overrides``), so the routes import no
Airflow and a test can serve them from any host. Airflow's is :mod:`airflow_batchinfer.plugin.desk`:
its login, its DAG permissions, its database's gates and rendered fields, its connections.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol

from fastapi import Depends

from airflow_batchinfer.review.bounds import Bounds
from airflow_batchinfer.review.gate import Gate

__all__ = ["Access", "AccessDep", "DecideDag", "DeskHost", "ReadDag", "access", "decide_dag", "read_dag"]


class Access(Protocol):
    """What one request may ask its host, as its signed-in user."""

    @property
    def user_id(self) -> str: ...

    @property
    def user_name(self) -> str:
        """The user as a decision records them (``by``)."""
        ...

    def gates(
        self, *, dag_id: str | None = None, run_id: str | None = None, open_only: bool = True
    ) -> list[Gate]:
        """Review gates of plan tasks, oldest first (``open_only``: those waiting for an answer), with
        their plan task's rendered fields: every DAG's, whatever the user may read."""
        ...

    def run_exists(self, dag_id: str, run_id: str) -> bool:
        """Whether the DAG run exists."""
        ...

    def readable(self, dag_ids: Collection[str]) -> set[str]:
        """The DAGs of ``dag_ids`` whose review gates the user may read."""
        ...

    def may_respond(self, assigned_ids: set[str]) -> bool:
        """Whether the user is one of the users a gate is assigned to (by id), as the host decides
        who may answer a gate."""
        ...

    def storage_options(self, aws_conn_id: str | None) -> dict[str, Any]:
        """fsspec options for a plan task's AWS connection (``None``: none)."""
        ...

    def bounds(self) -> Bounds:
        """The desk's caps, from the host's settings (a bad value: a ``ConfigError``)."""
        ...


@dataclass(frozen=True)
class DeskHost:
    """The host's FastAPI dependencies. ``user`` runs on every request (it refuses one without a
    login); ``access`` is a request's :class:`Access`; ``read_dag`` and ``decide_dag`` guard a route
    on its path's ``dag_id`` (may read, may answer the DAG's review gates); ``overrides``: more
    ``dependency_overrides`` the host's own dependencies need in this app."""

    user: Callable[..., Any]
    access: Callable[..., Access]
    read_dag: Callable[..., Any]
    decide_dag: Callable[..., Any]
    overrides: Mapping[Callable[..., Any], Callable[..., Any]] = field(default_factory=dict)


def access() -> Access:
    """The request's :class:`Access`: :attr:`DeskHost.access` replaces this."""
    raise NotImplementedError("the desk's host supplies access (DeskHost.access)")


def read_dag() -> None:
    """May the user read the path's DAG's review gates: :attr:`DeskHost.read_dag` replaces this."""
    raise NotImplementedError("the desk's host supplies read_dag (DeskHost.read_dag)")


def decide_dag() -> None:
    """May the user answer the path's DAG's review gates: :attr:`DeskHost.decide_dag` replaces this."""
    raise NotImplementedError("the desk's host supplies decide_dag (DeskHost.decide_dag)")


AccessDep = Annotated[Access, Depends(access)]
ReadDag = Depends(read_dag)
DecideDag = Depends(decide_dag)
