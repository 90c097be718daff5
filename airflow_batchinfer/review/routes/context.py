"""What every gate route starts from: the DAG run's gate and where its storage is
(:func:`run_context`, the checks a run root passes before the desk reads it), the round a request
asks for (:func:`round_of`) and the round's view, shared between requests (:func:`view`)."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, is_dataclass
from typing import Any

from fastapi import HTTPException, status

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.review.browse import RoundView
from airflow_batchinfer.review.gate import Gate, reviewed_round
from airflow_batchinfer.review.routes.host import Access
from airflow_batchinfer.state.owner import RunIdentity, creator_of, parse_owner, read_owner

MAX_TEXT = 200  # characters of a search text or a group name
VIEW_TTL_S, MAX_VIEWS = 600.0, 32  # round views kept (each knows its round's shards and counts)


@dataclass
class RunContext:
    """A DAG run the desk can show: its gate and where its storage is."""

    dag_id: str
    run_id: str
    gate: Gate
    run_root: str
    so: dict[str, Any]
    round: int | None


def resolve_gate(gate: Gate, access: Access) -> None:
    """Fill in a gate's round from storage (an error is kept on the gate, not raised)."""
    if gate.run_root is None:
        gate.error = "the plan task has no rendered run_root"
        return
    try:
        gate.round = reviewed_round(gate.slot, gate.run_root, access.storage_options(gate.aws_conn_id))
    except Exception as exc:  # storage unreachable, a document of an unknown version, ...
        gate.error = f"{type(exc).__name__}: {exc}"


def run_context(access: Access, dag_id: str, run_id: str) -> RunContext:
    """The run's open gate (or, once answered, its latest one) with the run root from the host, for
    the user of ``access`` (who may read ``dag_id``: the route checks that): a root that another DAG
    created (``shared_run_root_dags`` let this one take it over) is served only if the user may read
    that DAG too, since its earlier rounds' rows are that DAG's."""
    gates = access.gates(dag_id=dag_id, run_id=run_id, open_only=False)
    if not gates:
        what = (
            "no review gate has opened in this DAG run"
            if access.run_exists(dag_id, run_id)
            else "no such DAG run"
        )
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"{dag_id}/{run_id}: {what}")
    open_gates = [g for g in gates if g.open]
    gate = open_gates[-1] if open_gates else gates[-1]
    if gate.run_root is None:
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            f"{dag_id}/{run_id}: the gate's task {gate.task_id} has no rendered run_root (not a "
            "batchinfer round controller, or its rendered fields were not stored)",
        )
    so = access.storage_options(gate.aws_conn_id)
    try:
        record = read_owner(gate.run_root, so)
        owner, creator = parse_owner(record), creator_of(record)
    except (ConfigError, ValueError) as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, f"{gate.run_root}: {exc}") from exc
    if owner is None:  # every run root a DAG run works in names it (its shard task claims it)
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            f"{dag_id}/{run_id}: {gate.run_root} has no owner.json: not this run's root",
        )
    if owner != RunIdentity(dag_id, run_id):
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            f"{dag_id}/{run_id}: its run root {gate.run_root} now belongs to the DAG run {owner}",
        )
    check_creator_readable(access, gate.run_root, dag_id, creator)
    try:
        r = reviewed_round(gate.slot, gate.run_root, so)
    except ConfigError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, f"{gate.run_root}: {exc}") from exc
    gate.round = r
    return RunContext(dag_id, run_id, gate, gate.run_root, so, r if r >= 0 else None)


def check_creator_readable(access: Access, run_root: str, dag_id: str, creator: str | None) -> None:
    """403 unless the user may read the DAG that created ``run_root`` (``dag_id`` itself is checked
    by the route): what a root holds from before a takeover is the creating DAG's."""
    if creator is None or creator == dag_id or creator in access.readable([creator]):
        return
    raise HTTPException(
        status.HTTP_403_FORBIDDEN,
        f"User={access.user_name} (id={access.user_id}) may not read DAG {creator!r}, which created the "
        f"run root {run_root} that {dag_id!r} now uses (shared_run_root_dags): its rows are that DAG's. "
        f"Remedy: ask for read access to {creator!r}'s HITL details, or review a run of its own root.",
    )


def check_respondent(gate: Gate, access: Access) -> None:
    """A gate with ``assigned_users`` takes decisions only from them (as Airflow takes answers)."""
    if not gate.assigned_users:
        return
    if not access.may_respond({u["id"] for u in gate.assigned_users}):
        names = ", ".join(sorted(u["name"] for u in gate.assigned_users))
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"User={access.user_name} (id={access.user_id}) is not among this gate's assigned users "
            f"({names}): only they may record decisions",
        )


def round_of(ctx: RunContext, requested: int | None) -> int:
    """The round a request reads: ``requested``, else the gate's; a closed one (404 otherwise)."""
    r = ctx.round if requested is None else requested
    if r is None or r < 0:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"{ctx.dag_id}/{ctx.run_id}: no round has closed yet")
    if ctx.round is not None and r > ctx.round:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, f"round {r} has not closed (the gate reviews round {ctx.round})"
        )
    return r


def jsonable(obj: Any) -> Any:
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if is_dataclass(obj) and not isinstance(obj, type):
        return asdict(obj)
    return obj


def so_key(ctx: RunContext) -> str:
    """The storage options as part of a cache key (two connections may reach two stores)."""
    return repr(sorted(ctx.so.items()))


_views: OrderedDict[tuple[str, int, str], tuple[float, RoundView]] = OrderedDict()
_views_lock = threading.Lock()


def view(ctx: RunContext, r: int) -> RoundView:
    """The round's view, shared between requests for a while: a view learns the round's shards and
    counts once (one document per shard), and a closed round's rejected rows do not change."""
    key = (ctx.run_root, r, so_key(ctx))
    now = time.monotonic()
    with _views_lock:
        hit = _views.get(key)
        if hit and now - hit[0] < VIEW_TTL_S:
            _views.move_to_end(key)
            return hit[1]
        found = RoundView(ctx.run_root, r, so=ctx.so)
        _views[key] = (now, found)
        while len(_views) > MAX_VIEWS:
            _views.popitem(last=False)
        return found
