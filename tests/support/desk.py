"""The review desk's app in process (:mod:`airflow_batchinfer.dev.desk`, which ``bench/calibration.py``
uses too) with what only the desk tests add: a closed run to review, gates opened as a test wants
them, a user without access to the DAG. The desk tests' module fixtures (test_app, test_focus_app,
test_shards_app, test_calibration_app, test_desk_bounded) build on :func:`desk_app`, or on
:func:`desk_with_runs` (runs waiting on their first gate)."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.dev.desk import DAG_ID, USERS, Desk, answer_gate, desk_app, open_gate
from airflow_batchinfer.run.jobs import round_kinds
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import write_run_config
from tests.support.fake_jobs import close, counted, finish_job, make_run, plan_round, read_rows

__all__ = [
    "DAG_ID", "MARKDOWN_IMAGE", "PAGE_DIR", "REJECTED", "SCRIPT", "USERS", "Desk", "add_gate", "answer_gate",
    "closed_run", "deny_dave", "desk_app", "desk_with_runs", "gate_url", "open_gate",
]  # fmt: skip

PAGE_DIR = Path(__file__).parents[2] / "airflow_batchinfer" / "review" / "page"
SCRIPT = "<script>alert(1)</script>"
MARKDOWN_IMAGE = "![x](http://evil.example/p.png)"


# -------------------------------------------------------------------------------- run roots
def closed_run(tmp_path: Path) -> RunConfig:
    """A run of 30 records in 3 shards whose round 0 closed: ids r00, r03, ... approved, the other 20
    rejected, for "too short: <n> chars" (even ids) or "wrong answer" (odd ids). r01's output is a
    script tag, r02's a markdown image."""
    cfg = make_run(tmp_path, review="every_round", max_rounds=3)
    write_run_config(cfg)
    plan = plan_round(cfg)
    kind = round_kinds(cfg, "rounds")[-1]
    for shard in plan.shards:
        ok, bad = [], []
        for row in read_rows(shard.uri):
            n = int(row["id"][1:])
            output = {1: SCRIPT, 2: MARKDOWN_IMAGE}.get(n, f"answer {n}")
            if n % 3 == 0:
                ok.append({**row, "result": output, "status": "approved", "judgment": {"approved": True}})
                continue
            reason = f"too short: {n} chars" if n % 2 == 0 else "wrong answer"
            judgment = {"approved": False, "reason": reason, "score": n / 100}
            bad.append({**row, "result": output, "status": "rejected", "judgment": judgment, "attempts": 1})
        finish_job(cfg, kind, 0, shard, {"approved": ok, "rejected": bad},
                   counted(approved=len(ok), rejected=len(bad)))  # fmt: skip
    summary = close(cfg, plan)
    assert (summary["approved"], summary["rejected"]) == (10, 20)
    return cfg


REJECTED = [f"r{i:02d}" for i in range(30) if i % 3]


# ----------------------------------------------------------------------------------- Airflow


def gate_url(run_id: str, suffix: str = "") -> str:
    return f"/batchinfer/api/gates/{DAG_ID}/{run_id}{suffix}"


def add_gate(
    run_id: str,
    task_id: str,
    rendered: dict[str, Any] | None,
    *,
    assignees: list[dict[str, str]] | None = None,
    answered: bool = False,
    subject: str | None = None,
) -> None:
    """A DAG run whose plan task ``task_id`` waits on its review gate (as the operator leaves it)."""
    from airflow._shared.timezones import timezone
    from airflow.models.hitl import HITLDetail
    from airflow.models.renderedtifields import RenderedTaskInstanceFields
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState
    from airflow.utils.types import DagRunTriggeredByType, DagRunType
    from sqlalchemy import insert

    with create_session() as session:
        dag = SerializedDagModel.get_dag(DAG_ID, session=session)
        run = dag.create_dagrun(
            run_id=run_id, run_after=timezone.utcnow(), run_type=DagRunType.MANUAL,
            triggered_by=DagRunTriggeredByType.TEST, state=DagRunState.RUNNING, session=session,
        )  # fmt: skip
        session.flush()
        ti = next(t for t in run.get_task_instances(session=session) if t.task_id == task_id)
        ti.state = TaskInstanceState.AWAITING_INPUT
        session.merge(ti)
        if rendered is not None:
            session.execute(
                insert(RenderedTaskInstanceFields).values(
                    dag_id=DAG_ID, task_id=task_id, run_id=run_id, map_index=-1, rendered_fields=rendered
                )
            )
        session.add(
            HITLDetail(
                ti_id=ti.id,
                options=["Continue", "Continue in place", "Accept remaining as they are", "Stop"],
                subject=subject or f"Round 1: review 20 pending records ({run_id})",
                body="the body",
                defaults=["Stop"],
                multiple=False,
                params={},
                assignees=assignees,
                responded_at=timezone.utcnow() if answered else None,
                responded_by={"id": "alice", "name": "alice"} if answered else None,
                chosen_options=["Stop"] if answered else None,
            )
        )


@contextmanager
def desk_with_runs(
    tmp_path_factory: pytest.TempPathFactory, roots: Mapping[str, str], *, answered: Collection[str] = ()
) -> Iterator[Desk]:
    """The desk's app with a DAG run for each of ``roots`` (its run id: its run root, which the run
    owns), waiting on its round 1 gate (answered for the runs in ``answered``)."""
    from airflow_batchinfer.state.owner import RunIdentity
    from tests.support.owners import write_owner

    with desk_app(tmp_path_factory.mktemp("airflow")) as desk:
        for run_id, root in roots.items():
            rendered = {"run_root": root, "aws_conn_id": None}
            add_gate(run_id, "round_01.plan", rendered, answered=run_id in answered)
            write_owner(root, RunIdentity(DAG_ID, run_id))
        desk.roots.update(roots)
        yield desk


@pytest.fixture
def deny_dave(desk: Desk, monkeypatch: pytest.MonkeyPatch) -> None:
    """dave may see no DAG at all (SimpleAuthManager has no such role: the check is patched)."""
    from airflow.api_fastapi.app import get_auth_manager

    am = get_auth_manager()
    real = am.is_authorized_dag

    def is_authorized_dag(*, user: Any, **kwargs: Any) -> bool:
        return user.get_id() != "dave" and real(user=user, **kwargs)

    monkeypatch.setattr(am, "is_authorized_dag", is_authorized_dag)
