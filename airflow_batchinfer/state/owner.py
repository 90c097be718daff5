"""Who owns a run root: one DAG run at a time works in ``<output_root>/<run_name>``.

Two DAG runs given the same ``run_name`` would otherwise interleave in one run root (both shard,
plan, run and close the same rounds). The run's first task records its owner — the DAG run's
``dag_id`` and ``run_id`` — in ``<run_root>/owner.json`` (a versioned JSON doc) before any other
work, and refuses to start while another DAG run that is still queued or running owns the root.

A run root belongs to the DAG that created it (``creator_dag_id``):
its results and rejected rows are that DAG's, shown on the review desk to that DAG's readers.

- No owner recorded: this run claims the root (its DAG becomes the creator).
- This DAG run is the owner (a retry, or the run cleared and re-run): it keeps it.
- A run of another DAG than the creator: refused, whatever state the owner run is in, unless the
  deployment lists both DAGs in the ``shared_run_root_dags`` limit. Nothing is written.
- The owner is queued or running: refused, with the remedy (another ``run_name``, or wait for /
  fail the other run). Nothing is written.
- The owner finished (``success``/``failed``) or no longer exists: this run takes the root over.
  Resuming a run under the same ``run_name`` is a feature: finished work is reused.

The same holds for what a run reads: an ``input`` inside a run root another DAG created (its
``results/``, say) is refused by the first task (:func:`input_refusal`, deciding with
:func:`decide_input`), or that DAG's rows would show on this run's review desk; a directory or
glob input's listed parts are checked by their directories (:func:`parts_refusal`).
And for where a new run root goes: inside a run root another DAG created, or around one, it is
refused by the first task (:func:`nesting_refusal`).

:func:`decide` is the pure decision (fed the stored record, this run's identity, the owner run's
state and the DAGs that may share); :func:`claim` does the I/O around it. :func:`verify_owner` is
for the run's later tasks: they must not touch a root another DAG run owns (a refused run's
``all_done`` tasks would).

A claim is one read-decide-write through :func:`airflow_batchinfer.storage.swap.update` (a file
lock on a local disk; a compare-and-swap on the object's ETag on S3): of two runs claiming at the
same instant, one writes and the other decides again on what it wrote, and refuses. Other object
stores have no conditional write, so two claims there could both succeed: a claim there is refused
(:func:`~airflow_batchinfer.storage.swap.require_exact`), naming the store and the remedy.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import read_run_config
from airflow_batchinfer.storage import swap
from airflow_batchinfer.storage.input_parts import InputParts
from airflow_batchinfer.storage.json_doc import encode_json, parse_json
from airflow_batchinfer.storage.location import Location, StorageOptions, join, parent, resolve

OWNER_FILE = "owner.json"
OWNER_VERSION = 2  # 2: records the DAG that created the run root (``creator_dag_id``)
CREATOR = "creator_dag_id"
SHARING_LIMIT = "shared_run_root_dags"  # the limit that lets DAGs take over each other's roots
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
    owns the root, or another DAG created it (``reason`` is the error with its remedy)."""

    action: Action
    reason: str
    owner: RunIdentity | None = None  # the recorded owner before this decision
    creator: str | None = None  # the DAG that created the root (a claim of a new root: this run's)


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


def creator_of(record: dict[str, Any] | None) -> str | None:
    """The DAG that created the run root ``record`` describes (``None``: no record); a record
    without one is an error (``ConfigError``)."""
    owner = parse_owner(record)
    return None if record is None or owner is None else _creator(record, owner)


def _creator(record: dict[str, Any], owner: RunIdentity) -> str:
    creator = record.get(CREATOR)
    if not isinstance(creator, str) or not creator:
        raise ConfigError(f"the owner record names no creating DAG ({CREATOR}: {creator!r})")
    return creator


def may_share(creator: str, dag_id: str, shared_dags: Collection[str]) -> bool:
    """Whether a run of ``dag_id`` may use a run root ``creator`` created: its own, or both DAGs are
    listed in the deployment's :data:`SHARING_LIMIT`."""
    return dag_id == creator or (dag_id in shared_dags and creator in shared_dags)


def decide(
    record: dict[str, Any] | None,
    me: RunIdentity,
    owner_state: str | None,
    *,
    run_root: str = "the run root",
    shared_dags: Collection[str] = (),
) -> Decision:
    """What this run does with a run root whose stored owner record is ``record``.

    :param record: ``owner.json`` as stored (``None``: no owner recorded).
    :param me: this DAG run.
    :param owner_state: the recorded owner run's state (``queued``, ``running``, ``success``,
        ``failed``), or ``None`` when that run no longer exists. Not consulted when ``record`` is
        ``None``, names ``me``, or was created by a DAG this run may not share with.
    :param shared_dags: the :data:`SHARING_LIMIT` in force: DAGs whose runs may take over each
        other's finished run roots.
    """
    owner = parse_owner(record)
    if record is None or owner is None:
        return Decision("claim", f"{run_root} has no owner: {me} claims it", creator=me.dag_id)
    creator = _creator(record, owner)
    if owner == me:
        return Decision("keep", f"{me} already owns {run_root} (a retry or a re-run)", owner, creator)
    if not may_share(creator, me.dag_id, shared_dags):
        return Decision("refuse", _foreign(run_root, me, owner, creator), owner, creator)
    if owner_state is None:
        return Decision(
            "claim",
            f"{run_root} was owned by {owner}, which no longer exists: {me} takes it over",
            owner,
            creator,
        )
    state = str(getattr(owner_state, "value", owner_state)).lower()  # a DagRunState or its value
    if state in FINISHED_STATES:
        return Decision(
            "claim",
            f"{run_root} was owned by {owner}, which finished ({state}): {me} takes it "
            "over and resumes there",
            owner,
            creator,
        )
    what = state if state in LIVE_STATES else f"in state {state!r}"
    return Decision(
        "refuse",
        f"{run_root} belongs to DAG run {owner}, which is {what}: two DAG runs must not share a run root "
        f"(the run_name param). Remedy: trigger this run with another run_name, or wait until {owner} has "
        "finished (or mark it failed) and then clear this run to resume in the same root.",
        owner,
        creator,
    )


def _foreign(run_root: str, me: RunIdentity, owner: RunIdentity, creator: str) -> str:
    return (
        f"{run_root} belongs to DAG {creator!r}, which created it (its last owner: DAG run {owner}): a run "
        f"of DAG {me.dag_id!r} may not use it, whatever state that run is in, since its results and "
        f"rejected rows are {creator!r}'s. Remedy: trigger this run with another run_name or output_root; "
        f"if these DAGs may share run roots, the deployment lists both in {SHARING_LIMIT} (the DAG's "
        f"limits, the [batchinfer] config or the pool connection's extra)."
    )


def decide_input(
    record: dict[str, Any],
    me: RunIdentity,
    *,
    input_uri: str,
    run_root: str,
    shared_dags: Collection[str] = (),
) -> str | None:
    """Why ``me`` may not read ``input_uri``, which lies inside ``run_root`` (its ``owner.json`` is
    ``record``); ``None``: it may. The rule of :func:`decide` for the root itself: what a run root
    holds is its creating DAG's, readable by a run of a DAG that may share with it (:func:`may_share`)."""
    creator = creator_of(record)
    if creator is None or may_share(creator, me.dag_id, shared_dags):
        return None
    return (
        f"input {input_uri!r} lies inside the run root {run_root}, which DAG {creator!r} created: a run of "
        f"DAG {me.dag_id!r} may not read its results or rejected rows. Nothing was written. Remedy: name "
        f"an input outside that run root; if these DAGs may share run roots, the deployment lists both in "
        f"{SHARING_LIMIT} (the DAG's limits, the [batchinfer] config or the pool connection's extra)."
    )


def input_root_candidates(input_uri: str, prefixes: Collection[str]) -> list[str]:
    """The directories that would hold ``owner.json`` if ``input_uri`` lay inside a run root: its
    ancestors as storage opens them (symlinks resolved), deepest first, down to the widest of
    ``prefixes`` (the locations triggers may name) that admits it. None admits it (the input is the
    DAG's default, or a DAG built without ``limits=`` chose it): no directory, as for the
    prefixes, the DAG's code vouches for it (and storage above the prefixes may not be readable)."""
    from airflow_batchinfer.worker.security import normalize  # the prefix checks' canonical form

    def split(uri: str) -> tuple[str, list[str]]:  # ("/", path segments) or ("s3://", bucket and key)
        canon = normalize(uri)
        scheme, sep, rest = canon.partition("://")
        return (f"{scheme}://", rest.split("/")) if sep else ("/", [s for s in canon.split("/") if s])

    try:
        head, segments = split(input_uri)
    except ValueError:
        return []  # refused by the prefix check already
    depths: list[int] = []
    for prefix in prefixes:
        try:
            p_head, p_segments = split(prefix)
        except ValueError:
            continue
        if p_head == head and segments[: len(p_segments)] == p_segments:
            depths.append(max(len(p_segments), 0 if head == "/" else 1))  # a bucket at least
    if not depths:
        return []
    return [head + "/".join(segments[:n]) for n in range(len(segments) - 1, min(depths) - 1, -1)]


def input_refusal(
    input_uri: str,
    me: RunIdentity,
    so: StorageOptions | None = None,
    *,
    prefixes: Collection[str],
    shared_dags: Collection[str] = (),
) -> str | None:
    """Why ``me`` may not read ``input_uri`` (``None``: it may): it lies inside a run root (an
    ancestor of :func:`input_root_candidates` with an ``owner.json``, one read each) that a DAG
    ``me`` may not share with created (:func:`decide_input`)."""
    for root in input_root_candidates(input_uri, prefixes):
        check = f"input {input_uri!r} lies in no other DAG's run root"
        record = _readable_owner(root, so, check=check, instead="name an input outside it")
        if record is None:
            continue
        try:
            why = decide_input(record, me, input_uri=input_uri, run_root=root, shared_dags=shared_dags)
        except ConfigError as exc:
            raise ConfigError(f"{owner_uri(root)}: {exc}; {_REMEDY}") from exc
        if why is not None:
            return why
    return None


def parts_refusal(
    parts: InputParts,
    me: RunIdentity,
    so: StorageOptions | None = None,
    *,
    prefixes: Collection[str],
    shared_dags: Collection[str] = (),
) -> str | None:
    """Why ``me`` may not read a directory or glob input's listed ``parts`` (``None``: it may): the
    ancestors of the input's string (:func:`input_refusal`) miss a run root below a directory or
    under a wildcard (``s3://shared/**/results/*.jsonl``), so each distinct directory holding a part
    is walked as a file there would be (:func:`input_root_candidates`: symlinks resolved, up to the
    widest prefix admitting it), every directory read once (one ``owner.json`` read)."""
    if parts.kind == "file":
        return None
    check = f"input {parts.uri!r} lies in no other DAG's run root"
    folders = dict.fromkeys(parent(p.uri) for p in parts.parts)
    seen: set[str] = set()
    for folder in folders:
        for root in input_root_candidates(join(folder, "part"), prefixes):
            if root in seen:
                continue
            seen.add(root)
            record = _readable_owner(root, so, check=check, instead="name an input outside it")
            if record is None:
                continue
            why = decide_input(record, me, input_uri=parts.uri, run_root=root, shared_dags=shared_dags)
            if why is not None:
                return why
    return None


def nesting_refusal(
    run_root: str,
    me: RunIdentity,
    so: StorageOptions | None = None,
    *,
    prefixes: Collection[str],
    shared_dags: Collection[str] = (),
) -> str | None:
    """Why ``me`` may not create ``run_root`` (``None``: it may): it would lie inside a run root a DAG
    ``me`` may not share with created (an ancestor of :func:`input_root_candidates` with such an
    ``owner.json``, one read each), or hold one (an ``owner.json`` below it). Either way this run
    would add its directories to that DAG's root, or that DAG's later runs nested in it would be
    refused. A root that already has an owner record is :func:`decide`'s (its nesting was checked
    when it was created)."""
    check = f"the run root {run_root} nests in no other DAG's run root"
    instead = "name another output_root or run_name"
    if _readable_owner(run_root, so, check=check, instead=instead) is not None:
        return None
    for root in input_root_candidates(run_root, prefixes):
        record = _readable_owner(root, so, check=check, instead=instead)
        if (creator := _foreign_creator(record, root, me, shared_dags)) is not None:
            return _nested(f"lies inside the run root {root}", run_root, me, creator)
    for inner in _owner_records_below(run_root, so):
        record = _readable_owner(inner, so, check=check, instead=instead)
        if (creator := _foreign_creator(record, inner, me, shared_dags)) is not None:
            return _nested(f"would hold the run root {inner}", run_root, me, creator)
    return None


def _readable_owner(
    root: str, so: StorageOptions | None, *, check: str, instead: str
) -> dict[str, Any] | None:
    """``root``'s owner record (``None``: none); an unreadable one is refused (fail closed: it may be
    another DAG's), naming what the read was to ``check`` and the other remedy (``instead``)."""
    try:
        return read_owner(root, so)
    except PermissionError as exc:
        raise ConfigError(
            f"cannot read {owner_uri(root)} to check that {check} ({exc}). Remedy: let the run's storage "
            f"connection read {root} (on S3, also list it: a missing key is otherwise 403), or {instead}"
        ) from exc


def _foreign_creator(
    record: dict[str, Any] | None, root: str, me: RunIdentity, shared_dags: Collection[str]
) -> str | None:
    """The DAG that created ``root`` (``record``) when ``me`` may not share with it, else ``None``."""
    try:
        creator = creator_of(record)
    except ConfigError as exc:
        raise ConfigError(f"{owner_uri(root)}: {exc}; {_REMEDY}") from exc
    return creator if creator is not None and not may_share(creator, me.dag_id, shared_dags) else None


def _owner_records_below(run_root: str, so: StorageOptions | None) -> Iterator[str]:
    """The directories under ``run_root`` that hold an ``owner.json`` (a new root: usually none, or
    no directory at all), found walking it a directory at a time: the caller stops at the first that
    refuses, never listing a tree it would refuse whole."""
    loc = resolve(run_root, so)
    base = loc.path.rstrip("/") + "/"
    try:
        for directory, _dirs, files in loc.fs.walk(loc.path):
            rel = directory.rstrip("/") + "/"
            if OWNER_FILE in files and rel.startswith(base) and rel != base:  # not the root's own
                yield join(run_root, rel[len(base) :].rstrip("/"))
    except FileNotFoundError:
        return
    except PermissionError as exc:  # fail closed, as an unreadable record does
        raise ConfigError(
            f"cannot list {run_root} to check that it holds no other DAG's run root ({exc}). Remedy: let "
            "the run's storage connection list it, or name another output_root or run_name"
        ) from exc


def _nested(where: str, run_root: str, me: RunIdentity, creator: str) -> str:
    return (
        f"the run root {run_root} {where}, which DAG {creator!r} created: a run of DAG {me.dag_id!r} may "
        f"not nest its run root with {creator!r}'s (it would add its directories to {creator!r}'s, or "
        f"keep {creator!r}'s runs out of their own). Nothing was written. Remedy: trigger this run with "
        f"another run_name or output_root, outside {creator!r}'s run roots; if these DAGs may share run "
        f"roots, the deployment lists both in {SHARING_LIMIT} (the DAG's limits, the [batchinfer] config "
        "or the pool connection's extra)."
    )


_WHAT, _REMEDY = "run owner record", "delete it if no other DAG run uses this run root"


def read_owner(run_root: str, so: StorageOptions | None = None) -> dict[str, Any] | None:
    """``owner.json`` as stored, ``None`` when the root has none."""
    loc = resolve(owner_uri(run_root), so)
    raw = swap.read(loc)
    return None if raw is None else _parse(loc, raw)


def _parse(loc: Location, raw: bytes) -> dict[str, Any]:
    """The record, of this code's version (others are refused)."""
    return parse_json(loc, raw, schema_version=OWNER_VERSION, what=_WHAT, remedy=_REMEDY)


def owner_record(
    me: RunIdentity,
    *,
    creator: str | None = None,
    previous: RunIdentity | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What ``owner.json`` holds for ``me`` (without its ``schema_version``); ``creator``: the DAG
    that created the root (default: ``me``'s, for a new root)."""
    return {
        "dag_id": me.dag_id,
        "run_id": me.run_id,
        "claimed_at": datetime.now(UTC).isoformat(),
        "host": socket.gethostname(),
        "previous": None if previous is None else {"dag_id": previous.dag_id, "run_id": previous.run_id},
        **(extra or {}),
        CREATOR: creator or me.dag_id,
    }


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
    task_owns(run_root, context, so)
    return read_run_config(run_root, so)


StateOf = Callable[[RunIdentity], "str | None"]


def claim(
    run_root: str,
    me: RunIdentity,
    state_of: StateOf,
    so: StorageOptions | None = None,
    *,
    shared_dags: Collection[str] = (),
    extra: dict[str, Any] | None = None,
) -> Decision:
    """Record ``me`` as the owner of ``run_root`` unless another live DAG run owns it or another
    DAG created it (``shared_dags``: the :data:`SHARING_LIMIT` in force, see :func:`decide`).

    :param state_of: the state of a DAG run (``None`` if it does not exist); asked only about a
        recorded owner that is not ``me``, of a root this run's DAG may use.
    Returns the decision (``keep`` or ``claim``; a ``refuse`` is returned too, with nothing written:
    the caller raises its ``reason``). A ``ConfigError`` on a store without a compare-and-swap
    (see the module doc), before anything is read or written.
    """
    loc = resolve(owner_uri(run_root), so)
    swap.require_exact(loc, f"Claiming the run root {run_root} for DAG run {me}")

    def decide_on(record: dict[str, Any] | None) -> Decision:
        try:
            owner, creator = parse_owner(record), creator_of(record)
        except ConfigError as exc:
            raise ConfigError(f"{loc.uri}: {exc}; {_REMEDY}") from exc
        state = None  # another DAG's run is refused unasked: its state is none of this run's business
        if owner is not None and owner != me and creator is not None:
            state = state_of(owner) if may_share(creator, me.dag_id, shared_dags) else None
        return decide(record, me, state, run_root=run_root, shared_dags=shared_dags)

    decided: list[Decision] = []

    def change(current: bytes | None) -> bytes:  # may run again after another run's write
        decided.append(decide_on(None if current is None else _parse(loc, current)))
        if current is not None and decided[-1].action != "claim":
            return current  # keep or refuse (there is a record): nothing written
        record = owner_record(me, creator=decided[-1].creator, previous=decided[-1].owner, extra=extra)
        return encode_json(record, schema_version=OWNER_VERSION)

    swap.update(loc, change)
    return decided[-1]
