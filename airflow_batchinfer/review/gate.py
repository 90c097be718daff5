"""A review gate as the desk shows it: the HITL request of a round slot's plan task (``round_NN.plan``
or ``tail.plan``, maybe in a task group), with what the host (:mod:`airflow_batchinfer.plugin.desk`)
read about it from Airflow, and the round it reviews (:func:`reviewed_round`)."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import quote

from airflow_batchinfer.state.docs import TAIL, read_run_config, rounds_ran
from airflow_batchinfer.state.layout import RunLayout

__all__ = ["PLAN_TASK", "Gate", "reviewed_round"]

# A gate of ours: the plan task of a round slot (task group round_NN or tail, maybe in a group).
PLAN_TASK = re.compile(r"(?:^|\.)(?:round_(?P<n>\d+)|(?P<tail>tail))\.plan$")


@dataclass
class Gate:
    """One review gate: the HITL request of a plan task."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int
    subject: str
    created_at: datetime | None
    assigned_users: list[dict[str, str]]
    state: str | None
    open: bool
    rendered: dict[str, Any] = field(default_factory=dict)
    round: int | None = None
    error: str | None = None

    @property
    def slot(self) -> str:
        m = PLAN_TASK.search(self.task_id)
        if m is None:  # pragma: no cover - filtered out by the query
            raise ValueError(self.task_id)
        return TAIL if m.group("tail") else f"round-{int(m.group('n')):02d}"

    @property
    def run_root(self) -> str | None:
        root = self.rendered.get("run_root")
        return root if isinstance(root, str) and root else None

    @property
    def aws_conn_id(self) -> str | None:
        conn = self.rendered.get("aws_conn_id")
        return conn if isinstance(conn, str) and conn and conn != "None" else None

    @property
    def run_name(self) -> str | None:
        """The run's name: the last part of its run root (``<output_root>/<run_name>``)."""
        return RunLayout(self.run_root).name if self.run_root else None

    @property
    def title(self) -> str:
        """The gate's subject as a heading shows it: a run root (an internal path, in the subjects of
        gates an earlier release asked) named by the run's name instead."""
        subject = self.subject or ""
        root = self.run_root
        if root:
            name = self.run_name or "the run"
            subject = subject.replace(f"({root})", f"({name})").replace(root, name)
        return subject

    def required_actions_path(self) -> str:
        """The gate's Required Actions page, relative to the Airflow UI's base URL."""
        q = functools.partial(quote, safe="")
        return (
            f"dags/{q(self.dag_id)}/runs/{q(self.run_id)}/tasks/{q(self.task_id)}/required_actions"
            f"?map_index={self.map_index}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "task_id": self.task_id,
            "map_index": self.map_index,
            "slot": self.slot,
            "subject": self.subject,
            "title": self.title,  # the subject without the run root (headings show this)
            "run_name": self.run_name,
            "created_at": self.created_at.isoformat() if self.created_at else None,
            "open": self.open,
            "state": self.state,
            "run_root": self.run_root,
            "round": self.round,
            "assigned_users": self.assigned_users,
            "required_actions_path": self.required_actions_path(),
            "error": self.error,
        }


def reviewed_round(slot: str, run_root: str, so: dict[str, Any]) -> int:
    """The round a gate in ``slot`` reviews: ``round-NN`` → NN-1; ``tail`` → the last round the
    plans in storage ran (the tail runs under the next round number)."""
    if slot != TAIL:
        return int(slot.split("-")[1]) - 1
    return rounds_ran(RunLayout(run_root), read_run_config(run_root, so).retries.max_rounds, so) - 1
