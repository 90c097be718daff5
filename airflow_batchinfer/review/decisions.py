"""Reviewers' decisions on a round's rejected samples: accept, retry or drop.

A decision names samples by id, or selects every sample matching a filter (a bulk decision:
``{"group": …, "text": …}``, the page's filter, see :func:`~airflow_batchinfer.review.samples.matches`;
``{}`` selects every rejected sample of the round). Decisions are appended to
``round-NN/review/decisions.jsonl``, one versioned JSON line each (who, when, what, which filter);
the next round's plan seals the log and applies them when the gate is answered
(:mod:`airflow_batchinfer.review.apply`).
For each sample the **last** decision that names it or whose filter matches it wins; a sample no
decision selects is retried (the default):

* ``accept``: into ``results/``, marked ``accepted_by_review``;
* ``retry``: into the next round, as without review;
* ``drop``: out of the run, into ``dropped/`` with the reviewer's note.

A spot check (an approved row the judge job held back for people, ``spot_check_approved``) no
decision selects follows the judge instead: into ``results/`` as approved.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, get_args

from airflow_batchinfer.exceptions import ReviewClosedError, ReviewError
from airflow_batchinfer.judges.spot_check import SPOT_CHECK
from airflow_batchinfer.review.browse import RoundView
from airflow_batchinfer.review.samples import Sample, matches
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import swap
from airflow_batchinfer.storage.location import StorageOptions
from airflow_batchinfer.storage.location import resolve as resolve_uri

__all__ = [
    "ACTIONS",
    "DECISION_VERSION",
    "DEFAULT_ACTION",
    "FOLLOWS_JUDGE",
    "Action",
    "Decision",
    "DecisionLog",
    "Outcome",
    "Resolver",
    "resolve",
    "tally",
]

Action = Literal["accept", "retry", "drop"]
ACTIONS: tuple[Action, ...] = get_args(Action)
DEFAULT_ACTION: Action = "retry"
# What happens to a row: a decision's action, or (no decision) retry, but a spot check (an approval
# held back for people, judges.spot_check) follows the judge into results: "approve".
Outcome = Literal["accept", "retry", "drop", "approve"]
FOLLOWS_JUDGE: Outcome = "approve"
DECISION_VERSION = 1  # of each line of decisions.jsonl
MAX_NOTE = 2_000
MAX_IDS = 10_000  # ids one decision names at most (a larger selection: a filter)
MAX_FIELD = 1_000  # characters of ``by``, a filter's group or text, an id
FILTER_KEYS = ("group", "text")


@dataclass(frozen=True)
class Decision:
    """One reviewer's decision on round ``round``'s rejected samples: ``action`` for the samples
    ``ids`` names, or (a bulk decision) for every sample matching ``filter`` (``{"group", "text"}``,
    either or both; ``{}``: every sample). ``at`` is an ISO 8601 time in UTC (:meth:`make` sets it).
    Invalid values raise :class:`~airflow_batchinfer.exceptions.ReviewError` (a ``ValueError``)."""

    round: int
    action: Action
    by: str
    at: str
    note: str = ""
    ids: tuple[str, ...] = ()
    filter: dict[str, str] | None = None
    version: int = DECISION_VERSION

    def __post_init__(self) -> None:
        if self.version != DECISION_VERSION:
            raise ReviewError(
                f"review decision version {self.version!r} is not supported (expected {DECISION_VERSION}): "
                "it was written by another version of airflow-batchinfer"
            )
        if isinstance(self.round, bool) or not isinstance(self.round, int) or self.round < 0:
            raise ReviewError(f"a decision's round must be an integer >= 0, got {self.round!r}")
        if self.action not in ACTIONS:
            raise ReviewError(f"action {self.action!r} is not one of {', '.join(ACTIONS)}")
        if not isinstance(self.by, str) or not self.by.strip() or len(self.by) > MAX_FIELD:
            raise ReviewError(f"a decision needs who made it (by: 1 to {MAX_FIELD} characters)")
        try:
            datetime.fromisoformat(str(self.at))
        except ValueError:
            raise ReviewError(f"at {self.at!r} is not an ISO 8601 time") from None
        if not isinstance(self.note, str) or len(self.note) > MAX_NOTE:
            raise ReviewError(f"a note is text of at most {MAX_NOTE} characters")
        object.__setattr__(self, "ids", _ids(self.ids))
        object.__setattr__(self, "filter", _filter(self.filter))
        if not self.ids and self.filter is None:
            raise ReviewError("a decision names no samples: give ids, or a filter ({} selects every sample)")
        if self.ids and self.filter is not None:
            raise ReviewError("a decision gives either ids or a filter, not both")

    @classmethod
    def make(
        cls,
        round: int,
        action: Action,
        by: str,
        *,
        note: str = "",
        ids: Iterable[str | int] = (),
        filter: Mapping[str, str | None] | None = None,
    ) -> Decision:
        """A decision made now."""
        return cls(
            round=round,
            action=action,
            by=by,
            at=datetime.now(UTC).isoformat(timespec="seconds"),
            note=note,
            ids=tuple(str(i) for i in ids),
            filter=dict(filter) if filter is not None else None,  # type: ignore[arg-type]
        )

    @property
    def bulk(self) -> bool:
        return self.filter is not None

    def sent_back(self) -> dict[str, Any]:
        """What a retry decision tells the rows it sends back (their ``sent_back``: who, when, the
        note, the round reviewed): the next attempt's prompt may read the note, the desk shows it."""
        return {"by": self.by, "at": self.at, "note": self.note, "round": self.round}

    def selects(self, sample: Sample) -> bool:
        """Whether this decision names ``sample`` or its filter matches it."""
        if self.filter is not None:
            return matches(sample, self.filter.get("group"), self.filter.get("text"))
        return sample.id in self.ids

    def to_dict(self) -> dict[str, Any]:
        """The stored form (one line of ``decisions.jsonl``)."""
        return {
            "schema_version": self.version,
            "round": self.round,
            "action": self.action,
            "by": self.by,
            "at": self.at,
            "note": self.note,
            "ids": list(self.ids),
            "filter": dict(self.filter) if self.filter is not None else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Decision:
        """A stored decision; an unknown ``schema_version`` or field is refused."""
        if not isinstance(data, Mapping):
            raise ReviewError(f"a stored decision must be a JSON object, got {type(data).__name__}")
        known = {"schema_version", "round", "action", "by", "at", "note", "ids", "filter"}
        unknown = sorted(set(data) - known)
        version = data.get("schema_version")
        if version != DECISION_VERSION:
            raise ReviewError(
                f"review decision schema_version {version!r} is not supported (expected "
                f"{DECISION_VERSION}): it was written by another version of airflow-batchinfer"
            )
        if unknown:
            raise ReviewError(f"a stored decision has unknown fields {unknown}; known: {sorted(known)}")
        try:
            return cls(
                round=data["round"],
                action=data["action"],
                by=data["by"],
                at=data["at"],
                note=data.get("note") or "",
                ids=tuple(data.get("ids") or ()),
                filter=data.get("filter"),
                version=version,
            )
        except KeyError as exc:
            raise ReviewError(f"a stored decision lacks {exc.args[0]!r}") from None


def _ids(value: Any) -> tuple[str, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ReviewError(f"ids must be a list of sample ids, got {type(value).__name__}")
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, str | int):
            raise ReviewError(f"a sample id is a string or an integer, got {v!r}")
        s = str(v)
        if not s or len(s) > MAX_FIELD:
            raise ReviewError(f"a sample id has 1 to {MAX_FIELD} characters, got {s!r:.60}")
        out.append(s)
    ids = tuple(dict.fromkeys(out))
    if len(ids) > MAX_IDS:
        raise ReviewError(f"a decision names at most {MAX_IDS:,} ids ({len(ids):,} given): use a filter")
    return ids


def _filter(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ReviewError(f'a filter is an object {{"group", "text"}}, got {type(value).__name__}')
    unknown = sorted(set(value) - set(FILTER_KEYS))
    if unknown:
        raise ReviewError(f"unknown filter keys {unknown}; known: {list(FILTER_KEYS)}")
    out = {}
    for key in FILTER_KEYS:
        v = value.get(key)
        if v is None:
            continue
        if not isinstance(v, str) or len(v) > MAX_FIELD:
            raise ReviewError(f"filter {key} must be text of at most {MAX_FIELD} characters, got {v!r:.60}")
        v = v.strip() if key == "text" else v
        if v:
            out[key] = v
    return out


# ------------------------------------------------------------------------------------- the log
class DecisionLog:
    """Round ``round``'s decisions, ``round-NN/review/decisions.jsonl`` under ``run_root``.

    Every change is a read-modify-write through :func:`airflow_batchinfer.storage.swap.update`:
    reviewers deciding at the same instant, from any number of api-server processes, all have their
    decision recorded (a file lock on a local disk, a compare-and-swap on S3's ETag), and a reader
    sees the log before or after a change, never half of one. Other object stores have no
    conditional write (the last of two simultaneous writers would win, losing the other's
    decision): :meth:`append` is refused there, naming the store and the remedy. (:meth:`seal` is
    the run's one write, so a gate there is still answered; it just has no decisions.)

    When the gate is answered the run :meth:`seal` s the log (a last line, ``{"sealed_at"}``) and
    applies exactly the decisions before the seal; an :meth:`append` after it is refused
    (:class:`~airflow_batchinfer.exceptions.ReviewClosedError`), so a decision is either applied or
    refused, never recorded and ignored."""

    def __init__(self, run_root: str, round: int, so: StorageOptions | None = None) -> None:
        if isinstance(round, bool) or not isinstance(round, int) or round < 0:
            raise ReviewError(f"round must be an integer >= 0, got {round!r}")
        self.run_root, self.round, self.so = run_root, round, so
        self.uri = RunLayout(run_root).decisions(round)
        self._loc = resolve_uri(self.uri, so)

    def read(self) -> list[Decision]:
        """The decisions in the order they were made (``[]`` before the first)."""
        return self._parse(swap.read(self._loc))[0]

    def append(self, decision: Decision) -> list[Decision]:
        """Add ``decision`` (validated; it must be for this log's round); refused once sealed.
        Returns the log's decisions, this one last. A ``ConfigError`` (nothing written) where the
        log's store has no compare-and-swap."""
        swap.require_exact(self._loc, f"Recording a review decision on round {self.round} of {self.run_root}")
        if not isinstance(decision, Decision):
            raise ReviewError(f"append takes a Decision, got {type(decision).__name__}")
        if decision.round != self.round:
            raise ReviewError(
                f"a decision on round {decision.round} does not belong in round {self.round}'s log"
            )
        line = _line(decision.to_dict())

        def add(current: bytes | None) -> bytes:
            sealed_at = self._parse(current)[1]
            if sealed_at is not None:
                raise ReviewClosedError(
                    f"round {self.round}'s gate was answered at {sealed_at} and its decisions applied: "
                    "this decision was not recorded (reload the page)"
                )
            return _ended(current) + line

        return self._parse(swap.update(self._loc, add))[0]

    def seal(self) -> list[Decision]:
        """Close the log to new decisions (once; sealing again changes nothing) and return the
        decisions it holds: the ones to apply."""

        def close(current: bytes | None) -> bytes:
            if current is not None and self._parse(current)[1] is not None:
                return current
            at = datetime.now(UTC).isoformat(timespec="seconds")
            return _ended(current) + _line({"schema_version": DECISION_VERSION, "sealed_at": at})

        return self._parse(swap.update(self._loc, close))[0]

    def _parse(self, data: bytes | None) -> tuple[list[Decision], str | None]:
        """The decisions, and when the log was sealed (``None``: open)."""
        decisions: list[Decision] = []
        sealed_at = None
        for n, raw in enumerate((data or b"").splitlines(), 1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
                if isinstance(row, dict) and "sealed_at" in row:
                    sealed_at = str(row["sealed_at"])
                    continue
                decisions.append(Decision.from_dict(row))
            except (ValueError, ReviewError) as exc:  # a JSONDecodeError is a ValueError
                raise ReviewError(f"{self.uri}, line {n}: {exc}") from None
        return decisions, sealed_at


def _line(row: dict[str, Any]) -> bytes:
    return json.dumps(row, ensure_ascii=False).encode() + b"\n"


def _ended(current: bytes | None) -> bytes:
    """``current`` ending with a newline (a log edited by hand may lack its last one)."""
    if not current:
        return b""
    return current if current.endswith(b"\n") else current + b"\n"


# ---------------------------------------------------------------------------------- resolving
class Resolver:
    """Which decision applies to a sample, for many samples: the last one that names its id or whose
    filter matches it. Samples must carry their prompts when :attr:`needs_prompts` (a text filter
    searches them)."""

    def __init__(self, decisions: Sequence[Decision]) -> None:
        self.decisions = list(decisions)
        self._by_id: dict[str, int] = {}
        self._filters: list[int] = []
        for i, d in enumerate(self.decisions):
            if d.filter is not None:
                self._filters.append(i)
            for sid in d.ids:
                self._by_id[sid] = i
        self.needs_prompts = any("text" in (d.filter or {}) for d in self.decisions)

    @property
    def by_filter(self) -> bool:
        """Whether some decision selects by filter (then which applies needs each row whole)."""
        return bool(self._filters)

    def named(self, sid: str) -> Decision | None:
        """The last decision that names id ``sid``: the one that applies when none is by filter."""
        i = self._by_id.get(sid)
        return None if i is None else self.decisions[i]

    def decision(self, sample: Sample) -> Decision | None:
        """The decision that applies to ``sample``, or ``None`` (then it is retried)."""
        best = self._by_id.get(sample.id, -1)
        for i in reversed(self._filters):
            if i < best:
                break
            if self.decisions[i].selects(sample):
                best = i
                break
        return self.decisions[best] if best >= 0 else None

    def action(self, sample: Sample) -> Action:
        d = self.decision(sample)
        return d.action if d is not None else DEFAULT_ACTION

    def outcome(self, sample: Sample) -> Outcome:
        """What happens to ``sample``: :meth:`action`, but an undecided spot check follows the judge."""
        d = self.decision(sample)
        return d.action if d is not None else undecided(sample.spot_check)


def undecided(spot_check: bool) -> Outcome:
    """What happens to a row no decision selects: retried, or (a spot check) approved as judged."""
    return FOLLOWS_JUDGE if spot_check else DEFAULT_ACTION


def resolve(decisions: Sequence[Decision], sample: Sample) -> Action:
    """What happens to ``sample``: the action of the last decision that names its id or whose filter
    matches it; ``retry`` when none does. (For many samples build one :class:`Resolver`.)"""
    return Resolver(decisions).action(sample)


def tally(decisions: Sequence[Decision], view: RoundView) -> dict[Outcome, int]:
    """How many of the round's rejected rows each action will take, ``{"accept", "retry", "drop"}``,
    and ``approve`` when the round holds spot checks (an undecided one follows the judge).

    Without decisions (the spot checks from the round's summary), or with only group filters over a
    round whose manifests count its groups exactly, it is computed from the counts (reading only the
    rows of ids the decisions name, found by their id alone); otherwise the round is read once."""
    counts: dict[Outcome, int] = dict.fromkeys(ACTIONS, 0)
    spot = view.spot_checks()
    if spot:
        counts[FOLLOWS_JUDGE] = 0
    decisions = list(decisions)
    if not decisions:
        counts[DEFAULT_ACTION] = view.total() - spot
        if spot:
            counts[FOLLOWS_JUDGE] = spot
        return counts
    resolver = Resolver(decisions)
    fast = None if resolver.needs_prompts else _tally_by_group(resolver, view, counts)
    if fast is not None:
        return fast
    for sample, _ in view.scan(prompts=resolver.needs_prompts):
        counts[resolver.outcome(sample)] += 1
    return counts


def _tally_by_group(
    resolver: Resolver, view: RoundView, empty: dict[Outcome, int]
) -> dict[Outcome, int] | None:
    """:func:`tally` from the manifests' exact group counts when every filter is a group filter (or
    ``{}``): each group takes the action of the last filter selecting it (none: the group's default,
    approve for the spot checks' group); a row a later decision names by id is moved to that
    decision's action. ``None`` when the groups are not known exactly."""
    groups = view.exact_groups()
    if groups is None:
        return None
    decisions = resolver.decisions

    def last_filter(group: str) -> int:
        for i in reversed(resolver._filters):
            if (decisions[i].filter or {}).get("group", group) == group:
                return i
        return -1

    def action(i: int, group: str) -> Outcome:
        return decisions[i].action if i >= 0 else undecided(group == SPOT_CHECK)

    winner = {g: last_filter(g) for g in groups}
    counts = dict(empty)
    for g, n in groups.items():
        counts[action(winner[g], g)] = counts.get(action(winner[g], g), 0) + n
    if resolver._by_id:
        for sample in view.with_ids(resolver._by_id):
            f = winner.get(sample.group)
            if f is None:  # a row whose group its manifest did not count: read the round instead
                return None
            i = resolver._by_id.get(sample.id, -1)
            if i > f:  # named by id after the last filter that selects its group
                counts[action(f, sample.group)] -= 1
                counts[action(i, sample.group)] = counts.get(action(i, sample.group), 0) + 1
    return counts
