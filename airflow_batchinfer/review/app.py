"""The review desk's web app, mounted by the plugin (:mod:`airflow_batchinfer.plugin`) at
``/batchinfer`` in Airflow's api-server.

It reads a closed round's rejected rows (:mod:`airflow_batchinfer.review.browse`) and records what a
reviewer decides about them (:mod:`airflow_batchinfer.review.decisions`) while the round's review
gate — the ``round_NN.plan`` / ``tail.plan`` task of a DAG run, waiting on the Required Actions page
— is open. Continue / Stop is still answered on the Required Actions page.

Where things come from:

- **Who**: Airflow's own login (``get_user`` on the whole app: the UI's ``_token`` cookie or a
  Bearer token); no second login.
- **May read**: GET on the DAG's HITL details (the same permission the Required Actions page needs).
  **May decide**: PUT on them and, when the gate names ``assigned_users``, being one of them — the
  checks Airflow makes before it accepts an answer to the gate.
- **Which storage**: the plan task's *rendered* ``run_root`` and ``aws_conn_id``, stored by Airflow
  when the task ran (``rendered_task_instance_fields``), and checked against the run root's
  ``owner.json``. A request names a DAG run, never a path.
- **Which round**: the gate of slot ``round_NN`` reviews round NN-1; the ``tail`` gate reviews the
  last round the plans in storage ran.

Endpoints (JSON unless noted; errors are ``{"detail": ...}``)::

    GET  /review/                                   the page (HTML); /review/static/<file>: its JS and CSS
    GET  /api/gates[?dag_id=&run_id=]               open review gates the user may read
    GET  /api/gates/{dag_id}/{run_id}               the run's gate (open, else its last one) and rounds
    GET  /api/gates/{dag_id}/{run_id}/summary       counts, reason groups, trend       [?round=]
    GET  /api/gates/{dag_id}/{run_id}/trend.svg     the trend plot (image/svg+xml)
    GET  /api/gates/{dag_id}/{run_id}/page          ?cursor=&size=&group=&text=&round=
    GET  /api/gates/{dag_id}/{run_id}/sample        ?n=&seed=&round=
    GET  /api/gates/{dag_id}/{run_id}/sample/{id}   one sample by id                    [?round=]
    GET  /api/gates/{dag_id}/{run_id}/field         ?shard=&position=&path=[&round=]: one value whole
    GET  /api/gates/{dag_id}/{run_id}/attempts/{id} the id's rows in the earlier rounds   [?round=]

Every sample they return is cut to the ``[batchinfer] review_*`` caps as its row is read
(:mod:`airflow_batchinfer.review.bounds`): its ``truncated`` names what was cut, and ``field`` reads
one such value whole (a sample's ``shard_id`` and ``position`` address it).
    GET  /api/gates/{dag_id}/{run_id}/shards        ?cursor=&size=&state=&round=: a round's shards
    GET  /api/gates/{dag_id}/{run_id}/decisions     the decisions so far and their tally
    GET  /api/gates/{dag_id}/{run_id}/calibration   the judge against the reviewers   [?round=]
    GET  /api/gates/{dag_id}/{run_id}/calibration.svg  its plot, the rounds so far (image/svg+xml)
    POST /api/gates/{dag_id}/{run_id}/decisions     {"action", "ids" | "filter", "note"} (open gate only)
"""

from __future__ import annotations

import functools
import re
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field, is_dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import quote

import orjson
from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, get_user, requires_access_dag
from airflow.models.dag import DagModel
from airflow.models.dagrun import DagRun
from airflow.models.hitl import HITLDetail
from airflow.models.renderedtifields import RenderedTaskInstanceFields as RTIF
from airflow.models.taskinstance import TaskInstance as TI
from airflow.utils.state import TaskInstanceState
from fastapi import Depends, FastAPI, HTTPException, Query, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import and_, select
from sqlalchemy.orm import Session
from starlette.exceptions import HTTPException as StarletteHTTPException

from airflow_batchinfer.exceptions import BatchInferError, ConfigError, ReviewClosedError, ReviewError
from airflow_batchinfer.review.bounds import Bounds, json_text, utf8_size
from airflow_batchinfer.review.browse import RoundView, Sample, field_value, trend
from airflow_batchinfer.review.calibration import calibration_chart, judge_checked, measured, scored_in_tenths
from airflow_batchinfer.review.decisions import MAX_IDS, MAX_NOTE, Decision, DecisionLog, Resolver, tally
from airflow_batchinfer.review.shards import MAX_SHARDS_PAGE, ShardPage, shard_page
from airflow_batchinfer.spec.limit_settings import CONFIG_SECTION
from airflow_batchinfer.state.docs import (
    TAIL,
    Plan,
    read_plan,
    read_run_config,
    read_summary,
    rounds_ran,
    slots,
)
from airflow_batchinfer.state.docs.calibration import Calibration, read_calibration
from airflow_batchinfer.state.docs.shard_status import RoundStatus, round_status
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.state.owner import RunIdentity, creator_of, parse_owner, read_owner

PAGE_DIR = Path(__file__).parent / "page"
STATIC_FILES = {"page.js": "text/javascript", "page.css": "text/css"}
MAX_PAGE = 200  # rows per page, and samples per draw
MAX_TEXT = 200  # characters of a search text or a group name
MAX_FIELD_PATH = 20_000  # characters of a field's path (record.<key>: keys up to review_field_bytes)
# A gate of ours: the plan task of a round slot (task group round_NN or tail, maybe in a group).
PLAN_TASK = re.compile(r"(?:^|\.)(?:round_(?P<n>\d+)|(?P<tail>tail))\.plan$")
OPEN_STATES = (TaskInstanceState.AWAITING_INPUT, TaskInstanceState.DEFERRED)
SO_TTL_S = 300.0  # how long storage options made from a connection are reused
VIEW_TTL_S, MAX_VIEWS = 600.0, 32  # round views kept (each knows its round's shards and counts)
SHARDS_TTL_S = 5.0  # an open round's shard states are read again after this (a closed one's: VIEW_TTL_S)
# Rows an attempts lookup reads at most, over all the earlier rounds (no index maps an id to its
# shard in an earlier round: recompaction and review decisions move it), and lookups kept.
ATTEMPTS_ROW_BUDGET, MAX_ATTEMPTS_CACHED = 1_000_000, 256

# The page under a Content-Security-Policy: its own scripts and styles, same-origin requests only,
# nothing from elsewhere (an image link in a model's output could not load even if rendered).
PAGE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'self'"
)
SVG_CSP = "default-src 'none'; style-src 'unsafe-inline'"


# ----------------------------------------------------------------------------- gates and runs
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


def _gates(
    session: Session, *, dag_id: str | None = None, run_id: str | None = None, open_only: bool = True
) -> list[Gate]:
    """Review gates of our plan tasks, oldest first: HITL requests joined with their task instance
    and the task's rendered fields (the way Airflow's own HITL routes join them)."""
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
    out = []
    for row in session.execute(query):
        if not PLAN_TASK.search(row.task_id):
            continue
        rendered = row.rendered_fields if isinstance(row.rendered_fields, dict) else {}
        open_ = row.responded_at is None and row.state in OPEN_STATES
        out.append(
            Gate(
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
                open=open_,
                rendered=rendered,
            )
        )
    return out


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
    from airflow_batchinfer.hooks.aws import storage_options_from_aws_conn

    so = storage_options_from_aws_conn(aws_conn_id)
    with _so_lock:
        _so_cache[aws_conn_id] = (time.monotonic(), so)
    return so


def reviewed_round(slot: str, run_root: str, so: dict[str, Any]) -> int:
    """The round a gate in ``slot`` reviews: ``round-NN`` → NN-1; ``tail`` → the last round the
    plans in storage ran (the tail runs under the next round number)."""
    if slot != TAIL:
        return int(slot.split("-")[1]) - 1
    return rounds_ran(RunLayout(run_root), read_run_config(run_root, so).max_rounds, so) - 1


@dataclass
class RunContext:
    """A DAG run the desk can show: its gate and where its storage is."""

    dag_id: str
    run_id: str
    gate: Gate
    run_root: str
    so: dict[str, Any]
    round: int | None


def _resolve_gate(gate: Gate) -> None:
    """Fill in a gate's round from storage (an error is kept on the gate, not raised)."""
    if gate.run_root is None:
        gate.error = "the plan task has no rendered run_root"
        return
    try:
        gate.round = reviewed_round(gate.slot, gate.run_root, storage_options(gate.aws_conn_id))
    except Exception as exc:  # storage unreachable, a document of an unknown version, ...
        gate.error = f"{type(exc).__name__}: {exc}"


def run_context(session: Session, dag_id: str, run_id: str, user: Any) -> RunContext:
    """The run's open gate (or, once answered, its latest one) with the run root from Airflow, for
    ``user`` (who may read ``dag_id``: the route checks that): a root that another DAG created
    (``shared_run_root_dags`` let this one take it over) is served only if ``user`` may read that
    DAG too, since its earlier rounds' rows are that DAG's."""
    gates = _gates(session, dag_id=dag_id, run_id=run_id, open_only=False)
    if not gates:
        exists = session.scalar(select(DagRun.id).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
        what = "no review gate has opened in this DAG run" if exists else "no such DAG run"
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"{dag_id}/{run_id}: {what}")
    open_gates = [g for g in gates if g.open]
    gate = open_gates[-1] if open_gates else gates[-1]
    if gate.run_root is None:
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            f"{dag_id}/{run_id}: the gate's task {gate.task_id} has no rendered run_root (not a "
            "batchinfer round controller, or its rendered fields were not stored)",
        )
    so = storage_options(gate.aws_conn_id)
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
    check_creator_readable(session, user, gate.run_root, dag_id, creator)
    try:
        r = reviewed_round(gate.slot, gate.run_root, so)
    except ConfigError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, f"{gate.run_root}: {exc}") from exc
    gate.round = r
    return RunContext(dag_id, run_id, gate, gate.run_root, so, r if r >= 0 else None)


# ------------------------------------------------------------------------------------- access
def may_read(user: Any, dag_id: str, team_name: str | None = None) -> bool:
    return bool(
        get_auth_manager().is_authorized_dag(
            method="GET",
            access_entity=DagAccessEntity.HITL_DETAIL,
            details=DagDetails(id=dag_id, team_name=team_name),
            user=user,
        )
    )


def team_of(session: Session, dag_id: str) -> str | None:
    return DagModel.get_dag_id_to_team_name_mapping([dag_id], session=session).get(dag_id)


def check_creator_readable(
    session: Session, user: Any, run_root: str, dag_id: str, creator: str | None
) -> None:
    """403 unless ``user`` may read the DAG that created ``run_root`` (``dag_id`` itself is checked
    by the route): what a root holds from before a takeover is the creating DAG's."""
    if creator is None or creator == dag_id or may_read(user, creator, team_of(session, creator)):
        return
    raise HTTPException(
        status.HTTP_403_FORBIDDEN,
        f"User={_user_name(user)} (id={user.get_id()}) may not read DAG {creator!r}, which created the "
        f"run root {run_root} that {dag_id!r} now uses (shared_run_root_dags): its rows are that DAG's. "
        f"Remedy: ask for read access to {creator!r}'s HITL details, or review a run of its own root.",
    )


def _user_name(user: Any) -> str:
    name = user.get_name() if hasattr(user, "get_name") else None
    return str(name or user.get_id())


def check_respondent(gate: Gate, user: Any) -> None:
    """A gate with ``assigned_users`` takes decisions only from them (as Airflow takes answers)."""
    if not gate.assigned_users:
        return
    ids = {u["id"] for u in gate.assigned_users}
    if not get_auth_manager().is_authorized_hitl_task(assigned_users=ids, user=user):
        names = ", ".join(sorted(u["name"] for u in gate.assigned_users))
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"User={_user_name(user)} (id={user.get_id()}) is not among this gate's assigned users "
            f"({names}): only they may record decisions",
        )


ReadDag = Depends(requires_access_dag("GET", DagAccessEntity.HITL_DETAIL))
DecideDag = Depends(requires_access_dag("PUT", DagAccessEntity.HITL_DETAIL))


# ---------------------------------------------------------------------------------- the tally
TALLY_SCAN_MAX = 200_000  # rows a text filter's tally may read on a request; beyond: at the answer
_tallies: OrderedDict[tuple[str, int, int], dict[str, int]] = OrderedDict()
_tallies_lock = threading.Lock()


def _tally(ctx: RunContext, r: int, log: list[Decision]) -> dict[str, int] | str:
    """How many rows each action takes, once per state of the log (the page asks after every
    decision). A text filter must render and search every row: over a large round that is left to
    the gate's answer, which applies the decisions anyway, and the page says so."""
    key = (ctx.run_root, r, len(log))
    with _tallies_lock:
        if key in _tallies:
            return _tallies[key]
    view = _view(ctx, r)
    if Resolver(log).needs_prompts and view.total() > TALLY_SCAN_MAX:
        return f"counted when the gate is answered (a text filter over {view.total():,} rows)"
    counts: dict[str, int] = {str(k): v for k, v in tally(log, view).items()}
    with _tallies_lock:
        _tallies[key] = counts
        while len(_tallies) > MAX_VIEWS:
            _tallies.popitem(last=False)
    return counts


# --------------------------------------------------------------------------- the calibration
_calibrated: OrderedDict[tuple[str, int, int, str], Calibration] = OrderedDict()
_calibrated_lock = threading.Lock()


def _calibrations(ctx: RunContext, r: int) -> list[tuple[Calibration, bool]]:
    """Rounds ``0..r``'s calibrations, each with whether it is live: the stored one of a round whose
    decisions took effect, else measured from the decisions so far (once per state of the log: the
    page asks after every decision)."""
    layout = RunLayout(ctx.run_root)
    out = []
    for q in range(r + 1):
        stored = read_calibration(layout, q, ctx.so)
        if stored is not None:
            out.append((stored, False))
            continue
        log = DecisionLog(ctx.run_root, q, ctx.so).read()
        if q < r and not log:
            continue  # an earlier round nobody reviewed
        key = (ctx.run_root, q, len(log), repr(sorted(ctx.so.items())))
        with _calibrated_lock:
            hit = _calibrated.get(key)
        if hit is None:
            tenths = scored_in_tenths(read_run_config(ctx.run_root, ctx.so).judge)
            hit = measured(_view(ctx, q), log, tenths=tenths)
            with _calibrated_lock:
                _calibrated[key] = hit
                while len(_calibrated) > MAX_VIEWS:
                    _calibrated.popitem(last=False)
        out.append((hit, True))
    return out


# ---------------------------------------------------------------------------------- the data
def _jsonable(obj: Any) -> Any:
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if is_dataclass(obj) and not isinstance(obj, type):
        return asdict(obj)
    return obj


def _round_of(ctx: RunContext, requested: int | None) -> int:
    r = ctx.round if requested is None else requested
    if r is None or r < 0:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"{ctx.dag_id}/{ctx.run_id}: no round has closed yet")
    if ctx.round is not None and r > ctx.round:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, f"round {r} has not closed (the gate reviews round {ctx.round})"
        )
    return r


_views: OrderedDict[tuple[str, int, str], tuple[float, RoundView]] = OrderedDict()
_views_lock = threading.Lock()


def _view(ctx: RunContext, r: int) -> RoundView:
    """The round's view, shared between requests for a while: a view learns the round's shards and
    counts once (one document per shard), and a closed round's rejected rows do not change."""
    key = (ctx.run_root, r, repr(sorted(ctx.so.items())))
    now = time.monotonic()
    with _views_lock:
        hit = _views.get(key)
        if hit and now - hit[0] < VIEW_TTL_S:
            _views.move_to_end(key)
            return hit[1]
        view = RoundView(ctx.run_root, r, so=ctx.so)
        _views[key] = (now, view)
        while len(_views) > MAX_VIEWS:
            _views.popitem(last=False)
        return view


def _planned(ctx: RunContext, requested: int | None) -> tuple[Plan, list[int]]:
    """The plan of the round whose shards to show, and every round that has one (not skipped):
    ``requested``, else the gate's round, else the last round planned (one that runs now). A round
    in progress is shown too: its shards' states are what its lanes have written so far."""
    layout = RunLayout(ctx.run_root)
    cfg = read_run_config(ctx.run_root, ctx.so)
    plans: dict[int, Plan] = {}
    for slot in slots(cfg.max_rounds):
        plan = read_plan(layout, slot, ctx.so)
        if plan is not None and plan.mode != "skip":
            plans[plan.round] = plan
    rounds = sorted(plans)
    r = requested
    if r is None:
        r = ctx.round if ctx.round in plans else (rounds[-1] if rounds else None)
    if r is None or r not in plans:
        what = "no round has been planned yet" if r is None else f"round {r} has not been planned"
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"{ctx.dag_id}/{ctx.run_id}: {what}")
    return plans[r], rounds


_statuses: OrderedDict[tuple[str, int, str], tuple[float, RoundStatus, bool]] = OrderedDict()
_statuses_lock = threading.Lock()


def _round_status(ctx: RunContext, plan: Plan) -> tuple[RoundStatus, bool]:
    """The round's shard states and whether it has closed, shared between requests for a while: a
    page and its next page read the lane documents once (O(lanes) documents), an open round's
    again after :data:`SHARDS_TTL_S`."""
    key = (ctx.run_root, plan.round, repr(sorted(ctx.so.items())))
    now = time.monotonic()
    with _statuses_lock:
        hit = _statuses.get(key)
    if hit and now - hit[0] < (VIEW_TTL_S if hit[2] else SHARDS_TTL_S) and hit[1].plan == plan:
        return hit[1], hit[2]
    layout = RunLayout(ctx.run_root)
    summary = read_summary(layout, plan.round, ctx.so)
    found = round_status(layout, plan, ctx.so, failed=None if summary is None else summary.failed_shards)
    with _statuses_lock:
        _statuses[key] = (now, found, summary is not None)
        _statuses.move_to_end(key)
        while len(_statuses) > MAX_VIEWS:
            _statuses.popitem(last=False)
    return found, summary is not None


_attempts_cache: OrderedDict[tuple[str, int, str, str], dict[str, Any]] = OrderedDict()
_attempts_lock = threading.Lock()


def _attempts(ctx: RunContext, r: int, sample_id: str, bounds: Bounds) -> dict[str, Any]:
    """:func:`attempts`' answer: round ``r-1`` down to 0, each searched for the id until found (an
    id is in a round's rejected rows at most once) or until the rows read reach
    :data:`ATTEMPTS_ROW_BUDGET` (checked before each block of a shard: the last block read may pass
    it); a closed round's rows do not change, so an answer is kept."""
    key = (ctx.run_root, r, sample_id, repr((sorted(ctx.so.items()), bounds)))
    with _attempts_lock:
        hit = _attempts_cache.get(key)
    if hit is not None:
        return hit
    found: list[dict[str, Any]] = []
    searched: list[int] = []
    read = 0
    complete = True
    for earlier in range(r - 1, -1, -1):
        sample, rows, whole = _view(ctx, earlier).find_within(sample_id, max(ATTEMPTS_ROW_BUDGET - read, 0))
        read += rows
        if not whole:
            complete = False
            break
        searched.append(earlier)
        if sample is not None:
            found.append(_jsonable(_with_sent_back(ctx, earlier, sample).bounded(bounds)))
    doc = {
        "round": r,
        "id": sample_id,
        "attempts": found,  # newest first: the rows of the rounds before r
        "searched": searched,
        "complete": complete,
        "rows_read": read,
        "row_budget": ATTEMPTS_ROW_BUDGET,
    }
    with _attempts_lock:
        _attempts_cache[key] = doc
        while len(_attempts_cache) > MAX_ATTEMPTS_CACHED:
            _attempts_cache.popitem(last=False)
    return doc


def _with_sent_back(ctx: RunContext, r: int, sample: Sample) -> Sample:
    """Round ``r``'s ``sample`` with the retry decision that sent it back to the next round (its
    ``sent_back``, as the decisions' application marked its pending row), when one did: the note its
    next attempt may have been told."""
    decision = Resolver(DecisionLog(ctx.run_root, r, ctx.so).read()).decision(sample)
    if decision is None or decision.action != "retry":
        return sample
    return replace(sample, sent_back=decision.sent_back())


def desk_bounds() -> Bounds:
    """The desk's caps from ``[batchinfer]`` (read per request: cheap, and a bad value is a 409 that
    names the setting, not a desk that fails to load)."""
    from airflow.configuration import conf

    return Bounds.from_options(lambda name: conf.get(CONFIG_SECTION, name, fallback=None))


def _whole(sample: Sample, path: str, r: int, bounds: Bounds) -> Response:
    """``path``'s value of ``sample``, whole: ``{round, shard_id, position, path, bytes, value}``
    (``bytes``: its UTF-8 size, as text or as JSON), or 413 past ``bounds.whole_field_bytes``."""
    value = field_value(sample, path)  # an unknown path: ReviewError, a 400
    text = value if isinstance(value, str) else json_text(value)
    size = utf8_size(text)
    if size > bounds.whole_field_bytes:
        raise HTTPException(
            413,  # content too large (its name in starlette changed across the versions we support)
            f"{path[:200]} of the sample at {sample.shard_id} position {sample.position} (round {r}) is "
            f"{size} bytes, more than [{CONFIG_SECTION}] review_whole_field_bytes = "
            f"{bounds.whole_field_bytes}: read it from the round's rejected file in storage, or raise "
            "the setting",
        )
    doc = {
        "round": r,
        "shard_id": sample.shard_id,
        "position": sample.position,
        "path": path,
        "bytes": size,
        "value": value,
    }
    return Response(orjson.dumps(doc), media_type="application/json")


class DecisionFilter(BaseModel):
    model_config = ConfigDict(extra="forbid")
    group: str | None = Field(default=None, max_length=MAX_TEXT)
    text: str | None = Field(default=None, max_length=MAX_TEXT)


class DecisionIn(BaseModel):
    """A decision on the selected samples (``ids``) or on every sample matching ``filter``."""

    model_config = ConfigDict(extra="forbid")
    action: Literal["accept", "retry", "drop"]
    ids: list[str | int] | None = Field(default=None, max_length=MAX_IDS)
    filter: DecisionFilter | None = None
    note: str = Field(default="", max_length=MAX_NOTE)
    round: int | None = None  # if given, must be the gate's round (a stale page is refused)


# --------------------------------------------------------------------------------------- app
def create_app() -> FastAPI:
    from airflow.api_fastapi.core_api.security import auth_manager_from_app

    app = FastAPI(
        title="Batch inference review desk",
        dependencies=[Depends(get_user)],
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    # Dependencies that read request.app.state.auth_manager would see this app's state.
    app.dependency_overrides[auth_manager_from_app] = get_auth_manager

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body')}: {e.get('msg')}"
            for e in exc.errors()
        ]
        return JSONResponse({"detail": "; ".join(errors) or "bad request"}, status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 401 and request.url.path.rstrip("/").endswith("/review"):
            return HTMLResponse(_LOGIN_PAGE, status_code=401, headers={"Content-Security-Policy": PAGE_CSP})
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(ReviewError)
    async def _review_error(request: Request, exc: ReviewError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=400)  # a bad cursor, count, filter, ...

    @app.exception_handler(BatchInferError)
    async def _batchinfer_error(request: Request, exc: BatchInferError) -> JSONResponse:
        # a document of a version this code does not know, a run root that is not a run, ...
        return JSONResponse({"detail": f"{type(exc).__name__}: {exc}"}, status_code=409)

    @app.exception_handler(OSError)
    async def _storage_error(request: Request, exc: OSError) -> JSONResponse:
        return JSONResponse({"detail": f"storage: {type(exc).__name__}: {exc}"}, status_code=502)

    @app.middleware("http")
    async def _headers(request: Request, call_next: Any) -> Response:
        response: Response = await call_next(request)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Cache-Control", "no-store")
        return response

    # ---------------------------------------------------------------------------- the page
    @app.get("/review/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(
            PAGE_DIR / "index.html", media_type="text/html", headers={"Content-Security-Policy": PAGE_CSP}
        )

    @app.get("/review/static/{name}", include_in_schema=False)
    def static(name: str) -> FileResponse:
        if name not in STATIC_FILES:
            raise HTTPException(status.HTTP_404_NOT_FOUND, "no such file")
        return FileResponse(PAGE_DIR / name, media_type=STATIC_FILES[name])

    # --------------------------------------------------------------------------- the gates
    @app.get("/api/gates")
    def list_gates(
        user: GetUserDep,
        session: SessionDep,
        dag_id: Annotated[str | None, Query(max_length=250)] = None,
        run_id: Annotated[str | None, Query(max_length=250)] = None,
    ) -> dict[str, Any]:
        gates = _gates(session, dag_id=dag_id, run_id=run_id)
        dag_ids = sorted({g.dag_id for g in gates})
        teams = DagModel.get_dag_id_to_team_name_mapping(dag_ids, session=session) if dag_ids else {}
        readable = {d for d in dag_ids if may_read(user, d, teams.get(d))}
        out = []
        for gate in gates:
            if gate.dag_id in readable and gate.run_root is not None:
                _resolve_gate(gate)
                out.append(gate.to_dict())
        return {"gates": out, "total_entries": len(out)}

    @app.get("/api/gates/{dag_id}/{run_id}", dependencies=[ReadDag])
    def get_gate(dag_id: str, run_id: str, session: SessionDep, user: GetUserDep) -> dict[str, Any]:
        ctx = run_context(session, dag_id, run_id, user)
        return {
            "dag_id": dag_id,
            "run_id": run_id,
            "run_root": ctx.run_root,
            "round": ctx.round,
            "gate": ctx.gate.to_dict(),
            # whether the desk shows the judge against the reviewers: not for people as the judge
            "calibrated": judge_checked(read_run_config(ctx.run_root, ctx.so).judge),
        }

    @app.get("/api/gates/{dag_id}/{run_id}/summary", dependencies=[ReadDag])
    def summary(
        dag_id: str,
        run_id: str,
        session: SessionDep,
        user: GetUserDep,
        round: Annotated[int | None, Query(ge=0)] = None,
    ) -> dict[str, Any]:
        ctx = run_context(session, dag_id, run_id, user)
        r = _round_of(ctx, round)
        view = _view(ctx, r)
        groups = view.groups()
        doc = read_summary(RunLayout(ctx.run_root), r, ctx.so)
        stored = doc.to_json() if doc is not None else {}  # a mode's own counts: in place has no rejected
        shown = ("pending", "approved", "rejected", "failed_records", "spot_checks")
        counts = {k: stored[k] for k in shown if k in stored}
        return {
            "dag_id": dag_id,
            "run_id": run_id,
            "round": r,
            "gate_round": ctx.round,
            "total": view.total(),
            "counts": counts,
            "groups": [{"group": g, "count": n} for g, n in groups.items()],  # most common first
            "trend": trend(ctx.run_root, so=ctx.so),
        }

    @app.get("/api/gates/{dag_id}/{run_id}/trend.svg", dependencies=[ReadDag])
    def trend_svg(dag_id: str, run_id: str, session: SessionDep, user: GetUserDep) -> Response:
        ctx = run_context(session, dag_id, run_id, user)
        svg = trend_chart(trend(ctx.run_root, so=ctx.so))
        return Response(svg, media_type="image/svg+xml", headers={"Content-Security-Policy": SVG_CSP})

    @app.get("/api/gates/{dag_id}/{run_id}/page", dependencies=[ReadDag])
    def browse(
        dag_id: str,
        run_id: str,
        session: SessionDep,
        user: GetUserDep,
        cursor: Annotated[str | None, Query(max_length=1000)] = None,
        size: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
        group: Annotated[str | None, Query(max_length=MAX_TEXT)] = None,
        text: Annotated[str | None, Query(max_length=MAX_TEXT)] = None,
        round: Annotated[int | None, Query(ge=0)] = None,
    ) -> dict[str, Any]:
        ctx = run_context(session, dag_id, run_id, user)
        r = _round_of(ctx, round)
        page = _view(ctx, r).page(
            cursor or None, size=size, group=group or None, text=text or None, bounds=desk_bounds()
        )
        return {
            "round": r,
            "samples": [_jsonable(s) for s in page.samples],
            "cursor": page.cursor,
            "scanned": page.scanned,
            "total": page.total,
            "capped": page.capped,  # stopped at review_page_bytes: the cursor goes on from there
        }

    @app.get("/api/gates/{dag_id}/{run_id}/sample", dependencies=[ReadDag])
    def sample(
        dag_id: str,
        run_id: str,
        session: SessionDep,
        user: GetUserDep,
        n: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 20,
        seed: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,
        round: Annotated[int | None, Query(ge=0)] = None,
    ) -> dict[str, Any]:
        ctx = run_context(session, dag_id, run_id, user)
        r = _round_of(ctx, round)
        view = _view(ctx, r)
        samples = view.sample(n=n, seed=seed, bounds=desk_bounds())
        capped = len(samples) < min(n, view.total())  # the rest drawn would pass review_page_bytes
        return {"round": r, "seed": seed, "samples": [_jsonable(s) for s in samples], "capped": capped}

    @app.get("/api/gates/{dag_id}/{run_id}/sample/{sample_id:path}", dependencies=[ReadDag])
    def find(
        dag_id: str,
        run_id: str,
        sample_id: str,
        session: SessionDep,
        user: GetUserDep,
        round: Annotated[int | None, Query(ge=0)] = None,
    ) -> dict[str, Any]:
        ctx = run_context(session, dag_id, run_id, user)
        r = _round_of(ctx, round)
        found = _view(ctx, r).find(sample_id, bounds=desk_bounds())
        if found is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"no sample {sample_id!r} in round {r}")
        return {"round": r, "sample": _jsonable(found)}

    @app.get("/api/gates/{dag_id}/{run_id}/field", dependencies=[ReadDag])
    def whole_field(
        dag_id: str,
        run_id: str,
        session: SessionDep,
        user: GetUserDep,
        shard: Annotated[str, Query(min_length=1, max_length=MAX_TEXT)],
        position: Annotated[int, Query(ge=0)],
        path: Annotated[str, Query(min_length=1, max_length=MAX_FIELD_PATH)],
        round: Annotated[int | None, Query(ge=0)] = None,
    ) -> Response:
        """One value of a sample whole (what its ``truncated`` names), up to review_whole_field_bytes:
        the sample is addressed by its ``shard_id`` and ``position`` (read straight from there)."""
        ctx = run_context(session, dag_id, run_id, user)
        r = _round_of(ctx, round)
        found = _view(ctx, r).at(shard, position)
        if found is None:
            raise HTTPException(
                status.HTTP_404_NOT_FOUND, f"no sample at {shard!r} position {position} in round {r}"
            )
        return _whole(found, path, r, desk_bounds())

    @app.get("/api/gates/{dag_id}/{run_id}/attempts/{sample_id:path}", dependencies=[ReadDag])
    def attempts(
        dag_id: str,
        run_id: str,
        sample_id: str,
        session: SessionDep,
        user: GetUserDep,
        round: Annotated[int | None, Query(ge=0)] = None,
    ) -> dict[str, Any]:
        """The rows of ``sample_id`` in the rounds before ``round`` (the gate's by default), newest
        first: each earlier attempt's prompt as sent, output, verdict, reason and score (a jury's
        members), and ``sent_back``: the retry decision that sent it on, when one did. Reads at most
        :data:`ATTEMPTS_ROW_BUDGET` rows (``complete``: every earlier round was searched to its end
        or to the id)."""
        ctx = run_context(session, dag_id, run_id, user)
        r = _round_of(ctx, round)
        if not sample_id or len(sample_id) > MAX_FIELD_PATH:
            raise HTTPException(
                status.HTTP_400_BAD_REQUEST, f"a sample id has 1 to {MAX_FIELD_PATH:,} characters"
            )
        return _attempts(ctx, r, sample_id, desk_bounds())

    @app.get("/api/gates/{dag_id}/{run_id}/shards", dependencies=[ReadDag])
    def shards(
        dag_id: str,
        run_id: str,
        session: SessionDep,
        user: GetUserDep,
        cursor: Annotated[str | None, Query(max_length=100)] = None,
        size: Annotated[int, Query(ge=1, le=MAX_SHARDS_PAGE)] = 100,
        state: Annotated[str | None, Query(max_length=MAX_TEXT)] = None,
        round: Annotated[int | None, Query(ge=0)] = None,
    ) -> dict[str, Any]:
        """A page of a round's shards (its lanes' documents, claims and quarantine records) with
        the round's counts by state; ``tracked`` is false for a round that ran one task per shard."""
        ctx = run_context(session, dag_id, run_id, user)
        plan, rounds = _planned(ctx, round)
        found, closed = _round_status(ctx, plan)
        page = shard_page(found, cursor=cursor or None, size=size, state=state or None, bounds=desk_bounds())
        if not found.tracked:  # one task per shard: the states are its tasks' in the Airflow grid
            page = ShardPage([], None, 0)
        return {
            "round": plan.round,
            "slot": plan.slot,
            "rounds": rounds,  # the rounds planned so far (each one's shards can be shown)
            "gate_round": ctx.round,
            "closed": closed,
            "tracked": found.tracked,
            "lanes": len(found.lane_docs),
            "total": len(found.rows),
            "counts": found.counts() if found.tracked else {},
            **page.to_dict(),
        }

    # ----------------------------------------------------------------------- the calibration
    @app.get("/api/gates/{dag_id}/{run_id}/calibration", dependencies=[ReadDag])
    def calibration(
        dag_id: str,
        run_id: str,
        session: SessionDep,
        user: GetUserDep,
        round: Annotated[int | None, Query(ge=0)] = None,
    ) -> dict[str, Any]:
        """The judge against the reviewers: round ``round`` (the gate's by default) as its decisions
        stand now (``live``), and every round up to it (stored once applied, else live)."""
        ctx = run_context(session, dag_id, run_id, user)
        r = _round_of(ctx, round)
        docs = _calibrations(ctx, r)
        return {
            "round": r,
            "gate_round": ctx.round,
            "calibration": docs[-1][0].to_json(),
            "live": docs[-1][1],
            "rounds": [{**doc.to_json(), "live": live} for doc, live in docs],
        }

    @app.get("/api/gates/{dag_id}/{run_id}/calibration.svg", dependencies=[ReadDag])
    def calibration_svg(dag_id: str, run_id: str, session: SessionDep, user: GetUserDep) -> Response:
        ctx = run_context(session, dag_id, run_id, user)
        r = _round_of(ctx, None)
        svg = calibration_chart([doc for doc, _ in _calibrations(ctx, r)])
        return Response(svg, media_type="image/svg+xml", headers={"Content-Security-Policy": SVG_CSP})

    # ------------------------------------------------------------------------ the decisions
    @app.get("/api/gates/{dag_id}/{run_id}/decisions", dependencies=[ReadDag])
    def decisions(
        dag_id: str,
        run_id: str,
        session: SessionDep,
        user: GetUserDep,
        round: Annotated[int | None, Query(ge=0)] = None,
    ) -> dict[str, Any]:
        ctx = run_context(session, dag_id, run_id, user)
        r = _round_of(ctx, round)
        log = DecisionLog(ctx.run_root, r, ctx.so).read()
        return {
            "round": r,
            "decisions": [d.to_dict() for d in log],
            "tally": _tally(ctx, r, log),  # how many of the round's rows each action takes
            "open": ctx.gate.open and r == ctx.round,
        }

    @app.post("/api/gates/{dag_id}/{run_id}/decisions", dependencies=[DecideDag], status_code=201)
    def decide(
        dag_id: str, run_id: str, body: DecisionIn, user: GetUserDep, session: SessionDep
    ) -> dict[str, Any]:
        ctx = run_context(session, dag_id, run_id, user)
        if not ctx.gate.open:
            raise HTTPException(
                status.HTTP_409_CONFLICT,
                f"{dag_id}/{run_id}: no review gate is open; decisions are recorded only while one waits",
            )
        check_respondent(ctx.gate, user)
        if ctx.round is None:
            raise HTTPException(status.HTTP_409_CONFLICT, "the gate reviews no closed round")
        if body.round is not None and body.round != ctx.round:
            raise HTTPException(
                status.HTTP_409_CONFLICT,
                f"the open gate reviews round {ctx.round}, not round {body.round}: reload the page",
            )
        if (body.ids is None) == (body.filter is None):
            raise HTTPException(status.HTTP_400_BAD_REQUEST, "give either ids (the selection) or a filter")
        if body.ids is not None and not body.ids:
            raise HTTPException(status.HTTP_400_BAD_REQUEST, "no ids selected")
        flt = None
        if body.filter is not None:
            flt = {k: v for k, v in body.filter.model_dump().items() if v}
        decision = Decision.make(
            ctx.round, body.action, _user_name(user), note=body.note, ids=body.ids or (), filter=flt
        )  # validated: a ReviewError is a 400
        log = DecisionLog(ctx.run_root, ctx.round, ctx.so)
        try:
            decisions = log.append(decision)
        except ReviewClosedError as exc:  # the gate was answered after the check above
            raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
        return {"round": ctx.round, "decision": decision.to_dict(), "decisions": len(decisions)}

    return app


@functools.cache
def get_app() -> FastAPI:
    """The one app of this process (the plugin asks for it on every plugin load)."""
    return create_app()


def trend_chart(rows: list[dict[str, Any]]) -> str:
    """The trend plot: records pending and approved per closed round, and the approval rate."""
    from airflow_batchinfer.charts import Series, bar_chart, line_chart, side_by_side

    rounds = [row.get("round") for row in rows]
    counts = bar_chart(
        rounds,
        [
            Series("pending", [row.get("pending") for row in rows], color="#bbb"),
            Series("approved", [row.get("approved") for row in rows], color="#2a7"),
        ],
        overlay=True,
        title="records per round",
        x_label="round",
    )
    rate = line_chart(
        rounds,
        [Series("approval rate", [row.get("approval_rate") for row in rows], color="#1f77b4")],
        title="approval rate",
        x_label="round",
        y_range=(0, 1),
    )
    return side_by_side(counts, rate)


_LOGIN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Review desk: sign in</title></head>
<body><h1>Review desk</h1><p>Not signed in. Sign in to Airflow, then open the run's
<b>Review desk</b> tab (or Browse → Review desk).</p></body></html>
"""
