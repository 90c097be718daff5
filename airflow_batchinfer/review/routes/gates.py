"""The review gates: those open that the user may read (``GET /api/gates``), and one DAG run's gate
with the round it reviews (``GET /api/gates/{dag_id}/{run_id}``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from airflow_batchinfer.review.calibration import judge_checked
from airflow_batchinfer.review.routes.context import resolve_gate, run_context
from airflow_batchinfer.review.routes.host import AccessDep, ReadDag
from airflow_batchinfer.state.docs import read_run_config

router = APIRouter()


@router.get("/api/gates")
def list_gates(
    access: AccessDep,
    dag_id: Annotated[str | None, Query(max_length=250)] = None,
    run_id: Annotated[str | None, Query(max_length=250)] = None,
) -> dict[str, Any]:
    gates = access.gates(dag_id=dag_id, run_id=run_id)
    readable = access.readable(sorted({g.dag_id for g in gates}))
    out = []
    for gate in gates:
        if gate.dag_id in readable and gate.run_root is not None:
            resolve_gate(gate, access)
            out.append(gate.to_dict())
    return {"gates": out, "total_entries": len(out)}


@router.get("/api/gates/{dag_id}/{run_id}", dependencies=[ReadDag])
def get_gate(dag_id: str, run_id: str, access: AccessDep) -> dict[str, Any]:
    ctx = run_context(access, dag_id, run_id)
    return {
        "dag_id": dag_id,
        "run_id": run_id,
        "run_root": ctx.run_root,
        "round": ctx.round,
        "gate": ctx.gate.to_dict(),
        # whether the desk shows the judge against the reviewers: not for people as the judge
        "calibrated": judge_checked(read_run_config(ctx.run_root, ctx.so).judging.judge),
    }
