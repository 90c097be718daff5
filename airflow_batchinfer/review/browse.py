"""Browsing a round's rejected rows straight from its shards, never loading the round.

:class:`RoundView` knows the round's rejected shards and their row counts without reading a row
(:class:`~airflow_batchinfer.review.round_files.RoundFiles`). From these counts:

* an unfiltered page seeks straight to its cursor's shard and row (a zstd shard is decompressed
  from its start up to there: shards are a few 10k rows; nothing is parsed before the cursor);
* a filtered page (reason group, text) scans forward from its cursor and stops after ``size``
  matches or ``scan_limit`` rows read, returning a cursor to go on from; shards whose job counted no
  row of the group (the manifests' ``reason_groups``) are skipped unread;
* a seeded random sample draws positions over the whole round and reads each touched shard once;
* an id is found by reading only the lines that hold its text.

Each sample is cut to the desk's :class:`~airflow_batchinfer.review.bounds.Bounds` as it is read
(:meth:`~airflow_batchinfer.review.samples.Sample.bounded`).
"""

from __future__ import annotations

import bisect
import contextlib
import random
import re
from collections.abc import Generator, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import orjson

from airflow_batchinfer.exceptions import ReviewError
from airflow_batchinfer.judges.reasons import OTHER
from airflow_batchinfer.review.bounds import Bounds
from airflow_batchinfer.review.round_files import RoundFiles, RoundShard, lacks
from airflow_batchinfer.review.samples import Sample, matches
from airflow_batchinfer.storage.digest import LineIds
from airflow_batchinfer.storage.records import parse_record

__all__ = ["MAX_PAGE", "Page", "RoundView"]

MAX_PAGE = 1_000  # samples one page or one random sample returns at most
_CURSOR = re.compile(r"^s(\d+):(\d+)$")


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


class RoundView(RoundFiles):
    """Round ``round``'s rejected rows (``round-NN/rejected/``) for review, read page by page.

    Constructing it reads nothing (:class:`~airflow_batchinfer.review.round_files.RoundFiles`). Safe
    to share between threads."""

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

    def with_ids(
        self, ids: Iterable[str], *, prompt: bool = False, until_found: bool = False
    ) -> Iterator[Sample]:
        """The rows whose id (as text) is one of ``ids``, in round order, without prompts unless
        ``prompt``. Reads the round once, parsing only the lines of those ids; ``until_found``: stops
        after the block where the last of ``ids`` turns up (a round holds an id once; a number id and
        a string id of the same text in later blocks are then not looked for)."""
        found = self._with_ids(ids, until_found)
        return (self._with_prompt(s) for s in found) if prompt else found

    def _with_ids(self, ids: Iterable[str], until_found: bool = False) -> Generator[Sample, None, None]:
        keys: dict[bytes, str] = {}  # each id's canonical JSON in a row (a string, or an integer): its text
        for sid in map(str, ids):
            keys[orjson.dumps(sid)] = sid
            if sid.lstrip("-").isdigit() and str(int(sid)) == sid:
                keys[sid.encode()] = sid
        if not keys:
            return
        missing = set(keys.values())
        # a block is looked at only if one id's text (as a line holds it: escaped) is in it
        needles = [k[1:-1] if k.startswith(b'"') else k for k in keys]
        id_of = LineIds(self.id_field)
        for shard in self._load():
            with contextlib.closing(self._blocks(shard)) as blocks:
                for start, block in blocks:
                    joined = b"\n".join(block)
                    if len(needles) <= 8 and not any(n in joined for n in needles):
                        continue
                    for k, line in enumerate(block):
                        if (text := keys.get(id_of(line))) is not None:
                            missing.discard(text)
                            yield self.to_sample(parse_record(line), shard.shard_id, start + k, prompt=False)
                    if until_found and not missing:
                        return

    # --------------------------------------------------------------------------------- internals
    def _seek_page(self, shards: list[RoundShard], index: int, row: int, size: int, fill: _Fill) -> Page:
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
        shards: list[RoundShard],
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
            if group is not None and lacks(shard, group):
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

    def _group_total(self, group: str | None, text: str | None) -> int | None:
        """A group's row count from the manifests, when they know it exactly."""
        if group is None or text is not None:
            return None
        shards = self._with_groups(scan=False)
        if any(s.groups is None or OTHER in s.groups for s in shards):
            return None
        return sum((s.groups or {}).get(group, 0) for s in shards)

    def _cursor(self, shards: list[RoundShard], index: int, row: int) -> str | None:
        while index < len(shards) and row >= shards[index].rows:
            index, row = index + 1, 0
        return None if index >= len(shards) else f"s{index}:{row}"

    def _parse(self, cursor: str | None, shards: list[RoundShard]) -> tuple[int, int]:
        if cursor is None or cursor == "":
            return 0, 0
        m = _CURSOR.match(str(cursor))
        if m is None:
            raise ReviewError(f"cursor {cursor!r} is not one this page returned (expected s<shard>:<row>)")
        return min(int(m.group(1)), len(shards)), int(m.group(2))


def _check_count(name: str, value: Any, minimum: int, maximum: int | None = MAX_PAGE) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ReviewError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ReviewError(f"{name} must be at most {maximum}, got {value}")
