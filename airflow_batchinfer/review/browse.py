"""Browsing a round's rejected rows straight from its shards, never loading the round.

:class:`RoundView` knows the round's rejected shards (``round-NN/rejected/part-*.jsonl.zst``) and
their row counts from what the round's close accepted (``jobs/<shard>.<kind>.accepted.json``: the
count of the rejected file's id digest), in O(shards) and without reading a row. From these counts:

* an unfiltered page seeks straight to its cursor's shard and row (a zstd shard is decompressed
  from its start up to there: shards are a few 10k rows; nothing is parsed before the cursor);
* a filtered page (reason group, text) scans forward from its cursor and stops after ``size``
  matches or ``scan_limit`` rows read, returning a cursor to go on from; shards whose job counted no
  row of the group (the manifests' ``reason_groups``) are skipped unread;
* a seeded random sample draws positions over the whole round and reads each touched shard once;
* the reason groups are the manifests' counts added up (a shard whose manifest has none is read).

Every row is read through the package's storage layer, so local paths and ``s3://`` work alike.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import random
import re
import threading
from collections.abc import Generator, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, cast

import orjson

from airflow_batchinfer.exceptions import BatchInferError, ReviewError
from airflow_batchinfer.judges.candidates import GENERATION_FIELDS
from airflow_batchinfer.judges.reasons import OTHER, ReasonGroups, reason_group, row_reason, text_of
from airflow_batchinfer.judges.spot_check import is_spot_check
from airflow_batchinfer.prompts.build import PromptBuilder
from airflow_batchinfer.prompts.retries import NO_RETRY, PREVIOUS, SENT_BACK, Previous, RetrySettings
from airflow_batchinfer.review.bounds import Bounds, clip, json_text, utf8_size
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import (
    AcceptedJob,
    Plan,
    read_accepted,
    read_job_manifest,
    read_plan,
    read_run_config,
    read_summary,
    slots,
)
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlDir, JsonlFile, files
from airflow_batchinfer.storage.digest import LineIds
from airflow_batchinfer.storage.location import StorageOptions, join
from airflow_batchinfer.storage.records import parse_record
from airflow_batchinfer.values import number

__all__ = ["FIELDS", "Page", "RoundView", "Sample", "ShardRows", "field_value", "matches", "trend"]

# Fields a job adds to an input record (the rest of a row is the record as the round read it).
OUTPUT_FIELDS = (
    frozenset({"result", "status", "error", "attempts", "round", "accepted_by_review"})
    | {"finish_reason", "max_tokens"}  # how the generation ended, and its budget (judges.truncation)
    | GENERATION_FIELDS  # its verdict, candidates and logprobs (judges.candidates)
)
MAX_PAGE = 1_000  # samples one page or one random sample returns at most
DOC_THREADS = 16  # documents read at once (one per shard: object stores answer in parallel)
_CURSOR = re.compile(r"^s(\d+):(\d+)$")
_MEMBER_REASON = re.compile(r"members\.(\d{1,3})\.reason")
TREND_FIELDS = (
    "round",
    "slot",
    "mode",
    "pending",
    "approved",
    "rejected",
    "exhausted",
    "inference_errors",
    "failed_records",
    "next_pending",
    "approval_rate",
)


@dataclass(frozen=True)
class Sample:
    """One rejected row as the review page shows it.

    ``position`` is the row's index within its shard's rejected file; ``prompt`` is rendered from the
    row's input fields with the run's ``prompt_template`` and ``system`` as the worker renders it
    (``None`` when it cannot be); ``output`` is the row's ``result``; ``group`` the reason's
    :func:`~airflow_batchinfer.judges.reasons.reason_group`; ``record`` the input fields (the row
    without ``result``, ``status``, ``error``, ``judgment``, ``attempts`` and ``round``).

    ``members``: a jury's verdict's members (``judgment.members``: each one's ``name``, ``type``,
    ``approved``, ``reason`` and ``score``), in the jury's order; ``sent_back``: the retry decision
    that sent the attempt back to the next round (``by``, ``at``, ``note``, ``round``: a pending row's
    own, or what the attempts lookup finds in the round's decisions).

    ``truncated`` names what :meth:`bounded` cut short, each with its whole size in UTF-8 bytes: a
    text of :data:`FIELDS` (its start kept), ``members.<i>.reason`` (a jury member's reason),
    ``record.<key>`` (one record field: the start of its JSON text kept, as a string) or ``record``
    (the record's later fields left out; its whole JSON's size). Empty: the sample is whole.
    :func:`field_value` reads one of them whole."""

    id: str
    shard_id: str
    position: int
    round: int
    attempts: int
    prompt: str | None
    output: str | None
    approved: bool
    reason: str
    score: float | None
    group: str
    record: dict[str, Any]
    status: str = "rejected"
    error: str | None = None
    truncated: Mapping[str, int] = field(default_factory=dict)
    # the judge's own verdict on a row held for people (review_below_score, a spot check), else None;
    # whether it awaits people (``judgment.for_review``), and whether it is a spot check of an approval
    judge_approved: bool | None = None
    for_review: bool = False
    spot_check: bool = False
    # what the attempt's prompt was told of the one before (the row's ``previous``): its prompt
    # renders from it; not shown apart (the earlier attempt is a row of its own)
    previous: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)
    members: tuple[Mapping[str, Any], ...] = ()
    sent_back: Mapping[str, Any] | None = None

    def bounded(self, bounds: Bounds) -> Sample:
        """This sample as the desk shows it: each text of :data:`FIELDS`, each jury member's reason
        and each record field cut to ``bounds.field_bytes``, the record to ``bounds.record_bytes``,
        what was cut in ``truncated``."""
        cut: dict[str, int] = {}
        texts: dict[str, str | None] = {}
        for name in FIELDS:
            value = getattr(self, name)
            texts[name] = value if value is None else _clip_into(cut, name, value, bounds.field_bytes)
        members = tuple(
            {**m, "reason": _clip_into(cut, f"members.{i}.reason", m["reason"], bounds.field_bytes)}
            for i, m in enumerate(self.members)
        )
        record = _bounded_record(self.record, bounds, cut)
        if not cut:
            return self
        return replace(self, **texts, members=members, record=record, truncated=cut)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "shard_id": self.shard_id,
            "position": self.position,
            "round": self.round,
            "attempts": self.attempts,
            "prompt": self.prompt,
            "output": self.output,
            "approved": self.approved,
            "reason": self.reason,
            "score": self.score,
            "group": self.group,
            "record": dict(self.record),
            "status": self.status,
            "error": self.error,
            "truncated": dict(self.truncated),
            "judge_approved": self.judge_approved,
            "for_review": self.for_review,
            "spot_check": self.spot_check,
            "members": [dict(m) for m in self.members],
            "sent_back": None if self.sent_back is None else dict(self.sent_back),
        }


# A sample's texts the desk cuts to ``field_bytes`` (and reads whole through field_value).
FIELDS = ("id", "prompt", "output", "reason", "error", "status")


def _clip_into(cut: dict[str, int], path: str, text: str, limit: int) -> str:
    head, whole = clip(text, limit)
    if whole is not None:
        cut[path] = whole
    return head


def _bounded_record(record: Mapping[str, Any], bounds: Bounds, cut: dict[str, int]) -> dict[str, Any]:
    """The record's fields in order, each cut to ``field_bytes`` (a value that is not text: as the
    start of its JSON text), until ``record_bytes`` are shown; then ``cut["record"]``."""
    out: dict[str, Any] = {}
    used = 0
    for key, value in record.items():
        whole: int | None = None
        shown: Any
        if isinstance(value, str):
            shown, whole = clip(value, bounds.field_bytes)
            text = shown
        elif isinstance(value, dict | list):
            text, whole = clip(json_text(value), bounds.field_bytes)
            shown = value if whole is None else text
        else:  # a number, a boolean, null
            shown, text = value, json_text(value)
        used += utf8_size(key) + utf8_size(text)
        if utf8_size(key) > bounds.field_bytes or used > bounds.record_bytes:
            cut["record"] = utf8_size(json_text(dict(record)))  # this field and the rest left out
            break
        out[key] = shown
        if whole is not None:
            cut[f"record.{key}"] = whole
    return out


@dataclass(frozen=True)
class Page:
    """One page of samples. ``cursor`` continues after it (``None``: the round's end); ``scanned`` is
    the number of rows read to fill it; ``total`` the rows the filter selects, when known without a
    scan (unfiltered: the round's rejected rows; a group alone: its count from the manifests);
    ``capped``: the page stopped before ``size`` samples at ``Bounds.page_bytes`` (its cursor goes on
    from the sample left out)."""

    samples: list[Sample]
    cursor: str | None
    scanned: int
    total: int | None
    capped: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "samples": [s.to_dict() for s in self.samples],
            "cursor": self.cursor,
            "scanned": self.scanned,
            "total": self.total,
            "capped": self.capped,
        }


class _Fill:
    """The samples of one answer and their size (their JSON), up to ``bounds.page_bytes``: one at a
    time, each cut to the bounds as it is read, so an answer never holds more."""

    def __init__(self, bounds: Bounds) -> None:
        self.bounds = bounds
        self.samples: list[Sample] = []
        self.bytes = 0
        self.capped = False

    def add(self, sample: Sample) -> bool:
        """Add ``sample`` (bounded); ``False``: it would pass the cap, and is left out (never the
        first: an answer always holds one sample)."""
        shown = sample.bounded(self.bounds)
        size = len(orjson.dumps(shown.to_dict()))
        if self.samples and self.bytes + size > self.bounds.page_bytes:
            self.capped = True
            return False
        self.samples.append(shown)
        self.bytes += size
        return True


class ShardRows(NamedTuple):
    """One rejected shard of the round: its id, its file's URI and its row count."""

    shard_id: str
    uri: str
    rows: int


def matches(sample: Sample, group: str | None = None, text: str | None = None) -> bool:
    """Whether ``sample`` is selected by a filter: ``group`` equals its reason group (when given), and
    ``text`` (when given, not blank) is a case-insensitive substring of its id, prompt, output or
    reason. The one rule for pages, searches and bulk decisions."""
    if group is not None and sample.group != group:
        return False
    needle = (text or "").strip().casefold()
    if not needle:
        return True
    return any(needle in f.casefold() for f in (sample.id, sample.prompt, sample.output, sample.reason) if f)


def field_value(sample: Sample, path: str) -> Any:
    """One value of a whole sample, by a path of its ``truncated`` (a text of :data:`FIELDS`,
    ``record`` or ``record.<key>``: the record field named by the rest of the path, dots and all)."""
    if path in FIELDS:
        return getattr(sample, path)
    if (m := _MEMBER_REASON.fullmatch(path)) and int(m[1]) < len(sample.members):
        return sample.members[int(m[1])]["reason"]
    if path == "record":
        return dict(sample.record)
    key = path.removeprefix("record.")
    if key != path and key in sample.record:
        return sample.record[key]
    raise ReviewError(
        f"sample {sample.id[:200]!r} has no field {path[:200]!r}: name one of {', '.join(FIELDS)}, "
        "members.<i>.reason, record or record.<key> (the paths its truncated map names)"
    )


def trend(run_root: str, so: StorageOptions | None = None) -> list[dict[str, Any]]:
    """Per closed round, from its ``summary.json``: round, slot, mode, pending, approved, rejected (in
    place: exhausted), inference errors, failed records, next pending and approval rate, as far as
    the summary has them. Rounds in order, up to the first one not closed."""
    layout = RunLayout(run_root)
    out = []
    r = 0
    while (summary := read_summary(layout, r, so)) is not None:
        stored = summary.to_json()  # the fields it has (a mode's own; none added since it was written)
        out.append({k: stored[k] for k in TREND_FIELDS if k in stored})
        r += 1
    return out


@dataclass
class _Shard:
    index: int
    shard_id: str
    uri: str
    rows: int
    accepted: AcceptedJob | None = None  # the accepted doc close wrote (None: none readable)
    groups: dict[str, int] | None = None  # its rejected rows' reason groups (None: not known yet)
    groups_known: bool = False  # groups looked up in the manifest (maybe still None: read the rows)


class RoundView:
    """Round ``round``'s rejected rows (``round-NN/rejected/``) for review, read page by page.

    Constructing it reads nothing; the first call lists the round's rejected shards and reads what
    close accepted for each (one small document per shard, in parallel). Safe to share between
    threads; :meth:`refresh` forgets what it learnt (after a re-run close)."""

    def __init__(self, run_root: str, round: int, so: StorageOptions | None = None) -> None:
        if isinstance(round, bool) or not isinstance(round, int) or round < 0:
            raise ReviewError(f"round must be an integer >= 0, got {round!r}")
        self.run_root = run_root
        self.round = round
        self.so = so
        self.layout = RunLayout(run_root)
        self._lock = threading.Lock()
        self._shards: list[_Shard] | None = None
        self._starts: list[int] = []  # each shard's first row's position in the round
        self._settings: tuple[str, _Prompts | None] | None = None
        self._spot: int | None = None

    # ----------------------------------------------------------------------------- what it holds
    def refresh(self) -> None:
        with self._lock:
            self._shards, self._settings, self._spot = None, None, None

    def shards(self) -> list[ShardRows]:
        """The round's rejected shards in order, with their row counts (O(shards), no row read)."""
        return [ShardRows(s.shard_id, s.uri, s.rows) for s in self._load()]

    def total(self) -> int:
        """The round's rejected rows."""
        return sum(s.rows for s in self._load())

    def groups(self) -> dict[str, int]:
        """The round's rejected rows per reason group (most common first, at most
        :data:`~airflow_batchinfer.judges.reasons.MAX_GROUPS` and ``(other)``): the jobs' manifests'
        ``reason_groups`` added up; a shard whose manifest has none (an older run) is read."""
        total = ReasonGroups()
        for shard in self._with_groups(scan=True):
            total.merge(shard.groups or {})
        return total.as_dict()

    def spot_checks(self) -> int:
        """The round's spot checks (approved rows held back for people), from its summary."""
        if self._spot is None:
            summary = read_summary(self.layout, self.round, self.so)
            self._spot = (summary.spot_checks or 0) if summary is not None else 0
        return self._spot

    @property
    def id_field(self) -> str:
        return self._run_settings()[0]

    # ---------------------------------------------------------------------------------- reading
    def page(
        self,
        cursor: str | None = None,
        *,
        size: int = 50,
        group: str | None = None,
        text: str | None = None,
        scan_limit: int = 200_000,
        bounds: Bounds | None = None,
    ) -> Page:
        """``size`` samples from ``cursor`` on (``None``: the start). Unfiltered, the page seeks straight
        to its position; with ``group`` and/or ``text`` (see :func:`matches`) it scans forward and
        stops after ``size`` matches or ``scan_limit`` rows read (then fewer samples, maybe none, and
        a cursor to go on scanning from). ``cursor`` is opaque: pass back what a page returned. Each
        sample is :meth:`Sample.bounded` as it is read (``bounds``: the defaults when ``None``), and the
        page stops at ``bounds.page_bytes`` (``capped``)."""
        _check_count("size", size, 1)
        _check_count("scan_limit", scan_limit, 1, None)
        text = (text or "").strip() or None
        if group is not None and not isinstance(group, str):
            raise ReviewError(f"group must be a string, got {group!r}")
        shards = self._load()
        index, row = self._parse(cursor, shards)
        fill = _Fill(bounds or Bounds())
        if group is None and text is None:
            return self._seek_page(shards, index, row, size, fill)
        return self._scan_page(shards, index, row, size, group, text, scan_limit, fill)

    def sample(self, n: int = 20, seed: int = 0, *, bounds: Bounds | None = None) -> list[Sample]:
        """``n`` rows drawn at random over the whole round (every row equally likely, so shards in
        proportion to their rows), the same ones for the same ``seed``; in round order. Each touched
        shard is read once, up to its last drawn row. Each sample is :meth:`Sample.bounded` as it is
        read; those past ``bounds.page_bytes`` are left out (then fewer than drawn)."""
        bounds = bounds or Bounds()
        _check_count("n", n, 0)
        shards = self._load()
        total = sum(s.rows for s in shards)
        if not n or not total:
            return []
        drawn = sorted(random.Random(seed).sample(range(total), min(n, total)))
        wanted: dict[int, list[int]] = {}
        for p in drawn:
            i = bisect.bisect_right(self._starts, p) - 1
            wanted.setdefault(i, []).append(p - self._starts[i])

        def read(i: int) -> list[Sample]:
            rows = set(wanted[i])
            last = max(rows)
            out = []
            for pos, line in self._lines(shards[i], stop=last + 1):
                if pos in rows:
                    out.append(self.to_sample(parse_record(line), shards[i].shard_id, pos).bounded(bounds))
            return out

        fill = _Fill(bounds)
        with ThreadPoolExecutor(min(8, len(wanted))) as ex:
            for part in ex.map(read, sorted(wanted)):
                if not all(fill.add(s) for s in part):
                    break
        return fill.samples

    def find(self, sample_id: str, *, bounds: Bounds | None = None) -> Sample | None:
        """The rejected row with this id (compared as text), or ``None``. Reads the round's shards in
        order until found; only lines that hold the id are parsed. :meth:`Sample.bounded` by
        ``bounds`` (the defaults when ``None``)."""
        found = next(self._with_ids([str(sample_id)]), None)
        return None if found is None else self._with_prompt(found).bounded(bounds or Bounds())

    def find_within(self, sample_id: str, row_budget: int) -> tuple[Sample | None, int, bool]:
        """The rejected row with this id, reading at most ``row_budget`` rows of the round (its shards
        in order, decompressed; only lines that hold the id parsed), with its prompt. Returns
        ``(sample or None, rows read, complete)``: ``complete`` is false when the budget ran out
        before the round's end without finding it (then the row may still be further on). A round
        holds an id at most once (a repeated id goes to ``rejects/``), so the first hit ends it."""
        _check_count("row_budget", row_budget, 0, None)
        key = orjson.dumps(str(sample_id))
        keys = {key}
        sid = str(sample_id)
        if sid.lstrip("-").isdigit() and str(int(sid)) == sid:
            keys.add(sid.encode())
        needles = [k[1:-1] if k.startswith(b'"') else k for k in keys]
        id_of = LineIds(self.id_field)
        read = 0
        for shard in self._load():
            if read >= row_budget:
                return None, read, False
            with contextlib.closing(self._blocks(shard)) as blocks:
                for start, block in blocks:
                    if read >= row_budget:
                        return None, read, False
                    read += len(block)
                    if any(n in b"\n".join(block) for n in needles):
                        for k, line in enumerate(block):
                            if id_of(line) in keys:
                                row = parse_record(line)
                                found = self.to_sample(row, shard.shard_id, start + k, prompt=False)
                                return self._with_prompt(found), read, True
        return None, read, True

    def at(self, shard_id: str, position: int) -> Sample | None:
        """The row at ``position`` of a shard's rejected file (``Sample.shard_id``, ``Sample.position``),
        or ``None``."""
        shard = next((s for s in self._load() if s.shard_id == shard_id), None)
        if shard is None or position < 0:
            return None
        for pos, line in self._lines(shard, start=position, stop=position + 1):
            return self.to_sample(parse_record(line), shard.shard_id, pos)
        return None

    def with_ids(self, ids: Iterable[str], *, prompt: bool = False) -> Iterator[Sample]:
        """The rows whose id (as text) is one of ``ids``, in round order, without prompts unless
        ``prompt``. Reads the round once, parsing only the lines of those ids."""
        found = self._with_ids(ids)
        return (self._with_prompt(s) for s in found) if prompt else found

    def _with_ids(self, ids: Iterable[str]) -> Generator[Sample, None, None]:
        keys: set[bytes] = set()  # each id's canonical JSON in a row: a string, or an integer
        for sid in map(str, ids):
            keys.add(orjson.dumps(sid))
            if sid.lstrip("-").isdigit() and str(int(sid)) == sid:
                keys.add(sid.encode())
        if not keys:
            return
        # a block is looked at only if one id's text (as a line holds it: escaped) is in it
        needles = [k[1:-1] if k.startswith(b'"') else k for k in keys]
        id_of = LineIds(self.id_field)
        for shard in self._load():
            for start, block in self._blocks(shard):
                joined = b"\n".join(block)
                if len(needles) <= 8 and not any(n in joined for n in needles):
                    continue
                for k, line in enumerate(block):
                    if id_of(line) in keys:
                        yield self.to_sample(parse_record(line), shard.shard_id, start + k, prompt=False)

    def exact_groups(self) -> dict[str, int] | None:
        """The round's rows per reason group, uncapped, when every shard's manifest counts its groups
        exactly (no ``(other)``, adding up to its rows); else ``None``. Reads no row."""
        total: dict[str, int] = {}
        for shard in self._with_groups(scan=False):
            groups = shard.groups
            if groups is None or OTHER in groups or sum(groups.values()) != shard.rows:
                return None
            for g, n in groups.items():
                total[g] = total.get(g, 0) + n
        return total

    def scan(self, *, prompts: bool = True) -> Iterator[tuple[Sample, dict[str, Any]]]:
        """Every rejected row of the round in order, as ``(sample, row)`` (streaming: one shard's
        block at a time). ``prompts=False`` leaves ``sample.prompt`` ``None`` (no rendering)."""
        for shard in self._load():
            for pos, line in self._lines(shard):
                row = parse_record(line)
                yield self.to_sample(row, shard.shard_id, pos, prompt=prompts), row

    def to_sample(
        self, row: Mapping[str, Any], shard_id: str = "", position: int = 0, *, prompt: bool = True
    ) -> Sample:
        """A row of this run (any round's rejected or pending row) as a :class:`Sample`."""
        id_field, prompts = self._run_settings()
        judgment = row.get("judgment")
        judgment = judgment if isinstance(judgment, dict) else {}
        reason = row_reason(row)
        score = judgment.get("score")
        record = {k: v for k, v in row.items() if k not in OUTPUT_FIELDS}
        rid = text_of(row.get(id_field))
        attempts = _int(row.get("attempts"), 0)
        error = row.get("error")
        output = row.get("result")
        previous = row.get(PREVIOUS)
        previous = previous if isinstance(previous, dict) else None
        return Sample(
            id=rid,
            shard_id=shard_id,
            position=position,
            round=_int(row.get("round"), self.round),
            attempts=attempts,
            prompt=_render(prompts, record, rid, attempts, previous) if prompt else None,
            output=None if output is None else text_of(output),
            approved=bool(judgment.get("approved", False)),
            reason=reason,
            score=number(score),
            group=reason_group(reason),
            record=record,
            status=text_of(row.get("status")) or "rejected",
            error=None if error is None else text_of(error),
            judge_approved=judge_approved
            if isinstance(judge_approved := judgment.get("judge_approved"), bool)
            else None,
            for_review=judgment.get("for_review") is True,
            spot_check=is_spot_check(judgment),
            previous=previous,
            members=_members(judgment.get("members")),
            sent_back=sent_back if isinstance(sent_back := row.get(SENT_BACK), dict) else None,
        )

    # --------------------------------------------------------------------------------- internals
    def _seek_page(self, shards: list[_Shard], index: int, row: int, size: int, fill: _Fill) -> Page:
        samples = fill.samples
        scanned = 0
        total = sum(s.rows for s in shards)
        while index < len(shards) and len(samples) < size:
            shard = shards[index]
            if row >= shard.rows:
                index, row = index + 1, 0
                continue
            want = size - len(samples)
            got = 0
            for pos, line in self._lines(shard, start=row, stop=row + want):
                if not fill.add(self.to_sample(parse_record(line), shard.shard_id, pos)):
                    return Page(samples, self._cursor(shards, index, pos), scanned + got, total, capped=True)
                got += 1
            scanned += got
            if got < want or row + got >= shard.rows:
                index, row = index + 1, 0  # this shard is done (or its file ends before its count)
            else:
                row += got
        return Page(samples, self._cursor(shards, index, row), scanned, total)

    def _scan_page(
        self,
        shards: list[_Shard],
        index: int,
        row: int,
        size: int,
        group: str | None,
        text: str | None,
        scan_limit: int,
        fill: _Fill,
    ) -> Page:
        samples = fill.samples
        scanned = 0
        known = self._with_groups(scan=False) if group is not None else shards
        while index < len(shards):
            shard = known[index]
            if group is not None and _lacks(shard, group):
                index, row = index + 1, 0  # its job counted no row of this group: not read
                continue
            for pos, line in self._lines(shard, start=row):
                if scanned >= scan_limit:
                    return Page(samples, self._cursor(shards, index, pos), scanned, None)
                scanned += 1
                # the prompt is rendered for the rows of the group (every row, without one)
                sample = self.to_sample(parse_record(line), shard.shard_id, pos, prompt=group is None)
                if group is not None:
                    if sample.group != group:
                        continue
                    sample = self._with_prompt(sample)
                if matches(sample, group, text):  # on the whole sample: then cut for the page
                    if not fill.add(sample):
                        cursor = self._cursor(shards, index, pos)
                        return Page(samples, cursor, scanned, self._group_total(group, text), capped=True)
                    if len(samples) == size:
                        cursor = self._cursor(shards, index, pos + 1)
                        return Page(samples, cursor, scanned, self._group_total(group, text))
            index, row = index + 1, 0
        return Page(samples, None, scanned, self._group_total(group, text))

    def _with_prompt(self, sample: Sample) -> Sample:
        prompts = self._run_settings()[1]
        prompt = _render(prompts, sample.record, sample.id, sample.attempts, sample.previous)
        return replace(sample, prompt=prompt)

    def _group_total(self, group: str | None, text: str | None) -> int | None:
        """A group's row count from the manifests, when they know it exactly."""
        if group is None or text is not None:
            return None
        shards = self._with_groups(scan=False)
        if any(s.groups is None or OTHER in s.groups for s in shards):
            return None
        return sum((s.groups or {}).get(group, 0) for s in shards)

    def _cursor(self, shards: list[_Shard], index: int, row: int) -> str | None:
        while index < len(shards) and row >= shards[index].rows:
            index, row = index + 1, 0
        return None if index >= len(shards) else f"s{index}:{row}"

    def _parse(self, cursor: str | None, shards: list[_Shard]) -> tuple[int, int]:
        if cursor is None or cursor == "":
            return 0, 0
        m = _CURSOR.match(str(cursor))
        if m is None:
            raise ReviewError(f"cursor {cursor!r} is not one this page returned (expected s<shard>:<row>)")
        return min(int(m.group(1)), len(shards)), int(m.group(2))

    def _blocks(self, shard: _Shard) -> Generator[tuple[int, list[bytes]], None, None]:
        """A shard's non-blank lines in blocks, each with its first line's position."""
        pos = 0
        file = JsonlFile(shard.uri, storage_options=self.so)
        blocks = cast(Generator[list[bytes], None, None], file.iter_line_blocks())
        with contextlib.closing(blocks):
            for block in blocks:
                lines = [line for line in block if line.strip()]
                if lines:
                    yield pos, lines
                    pos += len(lines)

    def _lines(self, shard: _Shard, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, bytes]]:
        """A shard's lines ``[start, stop)`` with their positions; lines before ``start`` are
        decompressed but not parsed."""
        if stop is not None and stop <= start:
            return
        blocks = self._blocks(shard)
        with contextlib.closing(blocks):
            for first, lines in blocks:
                end = first + len(lines)
                if end <= start:
                    continue
                for k in range(max(start - first, 0), len(lines)):
                    if stop is not None and first + k >= stop:
                        return
                    yield first + k, lines[k]
                if stop is not None and end >= stop:
                    return

    def _run_settings(self) -> tuple[str, _Prompts | None]:
        """The run's id field and the round's prompts: ``run.json`` with what a review changed for the
        round (the plan that ran it); without ``run.json``: ``id``, no prompts."""
        if self._settings is None:
            try:
                cfg = read_run_config(self.run_root, self.so)
            except BatchInferError:
                self._settings = ("id", None)
            else:
                with contextlib.suppress(BatchInferError):  # a plan that cannot be read: run.json's
                    cfg = plan.effective_config(cfg) if (plan := self._plan(cfg)) else cfg
                prompts: _Prompts | None
                try:
                    retry = RetrySettings(cfg.retry_template, cfg.retry_system)  # no prompt shows sampling
                    prompts = _Prompts(cfg.prompt_template, cfg.system, retry)
                except BatchInferError:
                    prompts = None
                self._settings = (cfg.id_field or "id", prompts)
        return self._settings

    def _plan(self, cfg: RunConfig) -> Plan | None:
        """The plan of the slot that ran this round."""
        for slot in slots(cfg.max_rounds):
            plan = read_plan(self.layout, slot, self.so)
            if plan is not None and plan.round == self.round and plan.mode != "skip":
                return plan
        return None

    def _load(self) -> list[_Shard]:
        with self._lock:
            if self._shards is None:
                self._shards = self._list()
                starts, n = [], 0
                for s in self._shards:
                    starts.append(n)
                    n += s.rows
                self._starts = starts
            return self._shards

    def _list(self) -> list[_Shard]:
        """The rejected shards and their counts from the accepted docs (a file without one is counted
        by reading it)."""
        r = self.round
        listed = JsonlDir(self.layout.rejected_dir(r), storage_options=self.so).shards()
        kinds: dict[str, list[str]] = {}
        for base in files.names(join(self.layout.round(r), "jobs"), self.so):
            if base.endswith(".accepted.json"):
                sid, _, kind = base[: -len(".accepted.json")].rpartition(".")
                kinds.setdefault(sid, []).append(kind)

        def one(item: tuple[int, Any]) -> _Shard:
            i, listed_shard = item
            sid = listed_shard.shard_id
            doc = None
            for kind in sorted(kinds.get(sid, [])):
                found = read_accepted(self.layout.accepted(r, sid, kind), self.so)
                if isinstance(found, AcceptedJob):
                    doc = found
                    break
            shard = _Shard(i, sid, listed_shard.uri, 0, accepted=doc)
            rows = _rejected_rows(doc)
            if rows is None:
                rows = sum(len(lines) for _, lines in self._blocks(shard))
            shard.rows = rows
            return shard

        if not listed:
            return []
        with ThreadPoolExecutor(min(DOC_THREADS, len(listed))) as ex:
            return list(ex.map(one, enumerate(listed)))

    def _with_groups(self, *, scan: bool) -> list[_Shard]:
        """The shards with their reason groups: the accepted doc's or its manifest's (the accepted
        attempt's); with ``scan``, a shard with neither is read."""
        shards = self._load()
        missing = [s for s in shards if not s.groups_known]
        if missing:
            with ThreadPoolExecutor(min(DOC_THREADS, len(missing))) as ex:
                found = list(ex.map(self._manifest_groups, missing))
            with self._lock:
                for s, groups in zip(missing, found, strict=True):
                    s.groups, s.groups_known = groups, True
        if scan:
            for s in shards:
                if s.groups is None:
                    counted = ReasonGroups()
                    for _, line in self._lines(s):
                        counted.add(row_reason(parse_record(line)))
                    with self._lock:
                        s.groups = counted.as_dict()
        return shards

    def _manifest_groups(self, shard: _Shard) -> dict[str, int] | None:
        doc = shard.accepted
        if doc is None:
            return None
        if doc.reason_groups is not None:
            return dict(doc.reason_groups)
        manifest = read_job_manifest(self.layout.job_manifest(self.round, shard.shard_id, doc.kind), self.so)
        if manifest is None or manifest.attempt != doc.attempt:
            return None  # another attempt's manifest: its groups are not this file's
        return None if manifest.reason_groups is None else dict(manifest.reason_groups)


def _lacks(shard: _Shard, group: str) -> bool:
    """Whether a shard's job counted no row of ``group`` (exactly: its groups were not capped)."""
    return shard.groups is not None and OTHER not in shard.groups and not shard.groups.get(group)


def _rejected_rows(doc: AcceptedJob | None) -> int | None:
    """The rows of the accepted attempt's rejected file: its id digest's count, else its counts."""
    if doc is None:
        return None
    digest = doc.digest("rejected")
    if digest is not None:
        return digest.count
    outcomes = doc.counts.outcomes
    return outcomes.max_attempts + outcomes.error if doc.kind == "in_place" else outcomes.rejected


class _Prompts:
    """The prompt the worker sent for a record, as text: the package's one renderer,
    :class:`~airflow_batchinfer.prompts.build.PromptBuilder`, with the round's template, system message and
    retry settings (a retry's prompt renders from the ``previous`` its row carries; chat messages
    shown as ``[role]`` blocks; a lone user message as its text)."""

    def __init__(self, template: str | None, system: str | None, retry: RetrySettings = NO_RETRY) -> None:
        self.builder = PromptBuilder(template, system=system, retry=retry)  # a bad template: ConfigError

    def text(
        self, record: dict[str, Any], rid: str, attempts: int, previous: Mapping[str, Any] | None = None
    ) -> str | None:
        """The prompt's text, or ``None`` when it cannot be built (the page shows the record)."""
        try:
            told = None if previous is None else Previous.from_dict(previous)
            request = self.builder.build(record, request_id=rid, attempt=max(attempts, 1), previous=told)
        except Exception:  # a bad template or record: the page shows the record instead
            return None
        if request.prompt is not None:
            return request.prompt
        return _as_text(
            [(str(m.get("role", "")), _content(m.get("content"))) for m in request.messages or ()]
        )


def _as_text(messages: list[tuple[str, str]]) -> str:
    if len(messages) == 1 and messages[0][0] == "user":
        return messages[0][1]
    return "\n\n".join(f"[{role}]\n{content}" for role, content in messages)


def _render(
    prompts: _Prompts | None,
    record: dict[str, Any],
    rid: str,
    attempts: int,
    previous: Mapping[str, Any] | None = None,
) -> str | None:
    return None if prompts is None else prompts.text(record, rid, attempts, previous)


def _members(value: Any) -> tuple[dict[str, Any], ...]:
    """A jury verdict's ``members`` as the desk shows them: each one's name, type, verdict, reason and
    score (whatever else a member holds left out; a member that is not an object skipped)."""
    if not isinstance(value, list):
        return ()
    out = []
    for m in value:
        if not isinstance(m, dict):
            continue
        out.append(
            {
                "name": text_of(m.get("name")),
                "type": text_of(m.get("type")),
                "approved": m["approved"] if isinstance(m.get("approved"), bool) else None,
                "reason": text_of(m.get("reason")),
                "score": number(m.get("score")),
            }
        )
    return tuple(out)


def _content(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts: their text
        texts = [p.get("text") for p in value if isinstance(p, dict) and isinstance(p.get("text"), str)]
        if len(texts) == len(value):
            return "\n".join(t for t in texts if t is not None)
    return json.dumps(value, ensure_ascii=False)


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _check_count(name: str, value: Any, minimum: int, maximum: int | None = MAX_PAGE) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ReviewError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ReviewError(f"{name} must be at most {maximum}, got {value}")
