"""Who owns a run root: one DAG run at a time works in ``<output_root>/<run_name>``.

Two DAG runs given the same ``run_name`` would otherwise interleave in one run root (both shard,
plan, run and close the same rounds). The run's first task records its owner — the DAG run's
``dag_id`` and ``run_id`` — in ``<run_root>/owner.json`` (a versioned JSON doc) before any other
work, and refuses to start while another DAG run that is still queued or running owns the root.

- No owner recorded: this run claims the root.
- This DAG run is the owner (a retry, or the run cleared and re-run): it keeps it.
- The owner is queued or running: refused, with the remedy (another ``run_name``, or wait for /
  fail the other run). Nothing is written.
- The owner finished (``success``/``failed``) or no longer exists: this run takes the root over.
  Resuming a run under the same ``run_name`` is a feature: finished work is reused.

:func:`decide` is the pure decision (fed the stored record, this run's identity and the owner
run's state); :func:`claim` does the I/O around it. :func:`verify_owner` is for the run's later
tasks: they must not touch a root another DAG run owns (a refused run's ``all_done`` tasks would).

On a local disk and on S3 a claim is one read-decide-write through
:func:`airflow_batchinfer.storage.swap.update` (a file lock; a compare-and-swap on the object's
ETag): of two runs claiming at the same instant, one writes and the other decides again on what it
wrote, and refuses. On other object stores (no conditional write) a claim is written, then read back
after ``settle_s``: the later write wins and the earlier run sees a live owner on its read-back and
refuses. (A run whose write lands more than ``settle_s`` after the other's read-back is not
detected there: the window is one read and one write of a small file; ``settle_s`` defaults to 1 s.)
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.run_config import RunConfig
from airflow_batchinfer.storage import swap
from airflow_batchinfer.storage.json_doc import encode_json, parse_json, read_json, write_json
from airflow_batchinfer.storage.location import Location, StorageOptions, join, resolve

OWNER_FILE = "owner.json"
OWNER_VERSION = 1
# How long a claim settles before it is read back, where it is not a compare-and-swap (the module doc).
SETTLE_S = 1.0
LIVE_STATES = frozenset({"queued", "running"})
FINISHED_STATES = frozenset({"success", "failed"})

Action = Literal["claim", "keep", "refuse"]


@dataclass(frozen=True)
class RunIdentity:
    """A DAG run: what owns a run root."""

    dag_id: str
    run_id: str

    def __str__(self) -> str:
        return f"{self.dag_id}/{self.run_id}"


@dataclass(frozen=True)
class Decision:
    """``claim``: write this run as the owner; ``keep``: it already is; ``refuse``: another live run
    owns the root (``reason`` is the error with its remedy)."""

    action: Action
    reason: str
    owner: RunIdentity | None = None  # the recorded owner before this decision


def owner_uri(run_root: str) -> str:
    return join(run_root, OWNER_FILE)


def parse_owner(record: dict[str, Any] | None) -> RunIdentity | None:
    """The owner a stored record names; ``ConfigError`` if it names none."""
    if record is None:
        return None
    dag_id, run_id = record.get("dag_id"), record.get("run_id")
    if not isinstance(dag_id, str) or not isinstance(run_id, str) or not dag_id or not run_id:
        raise ConfigError(f"the owner record names no DAG run ({record!r})")
    return RunIdentity(dag_id, run_id)


def decide(
    record: dict[str, Any] | None, me: RunIdentity, owner_state: str | None, *, run_root: str = "the run root"
) -> Decision:
    """What this run does with a run root whose stored owner record is ``record``.

    :param record: ``owner.json`` as stored (``None``: no owner recorded).
    :param me: this DAG run.
    :param owner_state: the recorded owner run's state (``queued``, ``running``, ``success``,
        ``failed``), or ``None`` when that run no longer exists. Not consulted when ``record`` is
        ``None`` or names ``me``.
    """
    owner = parse_owner(record)
    if owner is None:
        return Decision("claim", f"{run_root} has no owner: {me} claims it")
    if owner == me:
        return Decision("keep", f"{me} already owns {run_root} (a retry or a re-run)", owner)
    if owner_state is None:
        return Decision("claim", f"{run_root} was owned by {owner}, which no longer exists: {me} takes it "
                        "over", owner)  # fmt: skip
    state = str(getattr(owner_state, "value", owner_state)).lower()  # a DagRunState or its value
    if state in FINISHED_STATES:
        return Decision("claim", f"{run_root} was owned by {owner}, which finished ({state}): {me} takes it "
                        "over and resumes there", owner)  # fmt: skip
    what = state if state in LIVE_STATES else f"in state {state!r}"
    return Decision(
        "refuse",
        f"{run_root} belongs to DAG run {owner}, which is {what}: two DAG runs must not share a run root "
        f"(the run_name param). Remedy: trigger this run with another run_name, or wait until {owner} has "
        "finished (or mark it failed) and then clear this run to resume in the same root.",
        owner,
    )


_WHAT, _REMEDY = "run owner record", "delete it if no other DAG run uses this run root"


def read_owner(run_root: str, so: StorageOptions | None = None) -> dict[str, Any] | None:
    loc = resolve(owner_uri(run_root), so)
    return read_json(loc, schema_version=OWNER_VERSION, what=_WHAT, remedy=_REMEDY)


def _parse(loc: Location, raw: bytes) -> dict[str, Any]:
    return parse_json(loc, raw, schema_version=OWNER_VERSION, what=_WHAT, remedy=_REMEDY)


def owner_record(
    me: RunIdentity, *, previous: RunIdentity | None = None, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What ``owner.json`` holds for ``me`` (without its ``schema_version``)."""
    return {
        "dag_id": me.dag_id,
        "run_id": me.run_id,
        "claimed_at": datetime.now(UTC).isoformat(),
        "host": socket.gethostname(),
        "previous": None if previous is None else {"dag_id": previous.dag_id, "run_id": previous.run_id},
        **(extra or {}),
    }


def write_owner(
    run_root: str, me: RunIdentity, so: StorageOptions | None = None, *, previous: RunIdentity | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    record = owner_record(me, previous=previous, extra=extra)
    write_json(resolve(owner_uri(run_root), so), record, schema_version=OWNER_VERSION)
    return {"schema_version": OWNER_VERSION, **record}


class OwnedElsewhere(ConfigError):
    """The run root is owned by another DAG run: this run must not touch it."""


def verify_owner(run_root: str, me: RunIdentity, so: StorageOptions | None = None) -> None:
    """For every task after the first: raise :class:`OwnedElsewhere` when ``owner.json`` names
    another DAG run (this run's first task was refused, or another run has taken the root over
    since). A root without an owner record (written by ``batchinfer run``, or before owners were
    recorded) passes."""
    owner = parse_owner(read_owner(run_root, so))
    if owner is not None and owner != me:
        raise OwnedElsewhere(
            f"{run_root} belongs to DAG run {owner}, not to this run ({me}): nothing here may touch it. "
            "Remedy: trigger this run with another run_name, or wait until the other run has finished and "
            "clear this whole run (its first task then takes the root over)."
        )


def task_owns(run_root: str, context: Any, so: StorageOptions | None = None) -> None:
    """:func:`verify_owner` for an Airflow task: raises ``AirflowFailException`` (no retry) with the
    reason and remedy when the run root belongs to another DAG run. One call at the top of
    ``execute`` of every task that reads or writes the run root after the first."""
    ti = context.get("ti") if hasattr(context, "get") else None
    if ti is None or not getattr(ti, "run_id", None):
        return  # no DAG run (a unit test calling execute directly): nothing to compare with
    try:
        verify_owner(run_root, RunIdentity(ti.dag_id, ti.run_id), so)
    except OwnedElsewhere as exc:
        from airflow_batchinfer.compat import AirflowFailException

        raise AirflowFailException(str(exc)) from exc


def owned_run_config(run_root: str, context: Any, so: StorageOptions | None = None) -> RunConfig:
    """The run's settings, for a task of the DAG run that owns ``run_root`` (:func:`task_owns`):
    how every task after the first reads them, so a refused run's ``all_done`` tasks (close,
    report) never touch another run's root."""
    from airflow_batchinfer.rounds import read_run_config

    task_owns(run_root, context, so)
    return read_run_config(run_root, so)


StateOf = Callable[[RunIdentity], "str | None"]


def claim(
    run_root: str,
    me: RunIdentity,
    state_of: StateOf,
    so: StorageOptions | None = None,
    *,
    settle_s: float | None = None,
    extra: dict[str, Any] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Decision:
    """Record ``me`` as the owner of ``run_root`` unless another live DAG run owns it.

    :param state_of: the state of a DAG run (``None`` if it does not exist); asked only about a
        recorded owner that is not ``me``.
    Returns the decision (``keep`` or ``claim``; a ``refuse`` is returned too, with nothing written:
    the caller raises its ``reason``). On storage without a compare-and-swap a claim is read back
    after ``settle_s`` (see the module doc; ``None``: :data:`SETTLE_S`).
    """
    loc = resolve(owner_uri(run_root), so)

    def decide_on(record: dict[str, Any] | None) -> Decision:
        try:
            owner = parse_owner(record)
        except ConfigError as exc:
            raise ConfigError(f"{loc.uri}: {exc}; {_REMEDY}") from exc
        state = state_of(owner) if owner is not None and owner != me else None
        return decide(record, me, state, run_root=run_root)

    if swap.exact(loc):
        decided: list[Decision] = []

        def change(current: bytes | None) -> bytes:  # may run again after another run's write
            decided.append(decide_on(None if current is None else _parse(loc, current)))
            if current is not None and decided[-1].action != "claim":
                return current  # keep or refuse (there is a record): nothing written
            return encode_json(owner_record(me, previous=decided[-1].owner, extra=extra),
                               schema_version=OWNER_VERSION)  # fmt: skip

        swap.update(loc, change)
        return decided[-1]

    decision = decide_on(read_owner(run_root, so))
    if decision.action != "claim":
        return decision
    write_owner(run_root, me, so, previous=decision.owner, extra=extra)
    sleep(SETTLE_S if settle_s is None else settle_s)
    after = decide_on(read_owner(run_root, so))
    if after.action == "refuse":  # another run claimed it at the same time and its write won
        return after
    if after.action == "claim":  # ours was overwritten by a run that has ended since: take it again
        write_owner(run_root, me, so, previous=after.owner, extra=extra)
    return decision
