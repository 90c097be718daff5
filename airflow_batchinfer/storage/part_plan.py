"""Planning round-0 shards over an input of part files (:mod:`~airflow_batchinfer.storage.input_parts`),
read in place as one file is (:mod:`~airflow_batchinfer.storage.range_plan`): nothing copied, a few
small reads per shard.

The parts are walked in order, filling shards of about ``records_per_shard`` records (the last ones
tapered for the lanes across the whole input, :mod:`~airflow_batchinfer.storage.taper`): a small part
joins the shard whole (never opened: its records are estimated from its size), a part that does not fit
starts the next shard, a large one is cut into pieces (byte ranges at line starts; a multi-frame zstd
part's frame groups with their lead-in). A single-frame zstd part cannot be cut: it is one piece
whatever its size (a huge one gets a notice: ``batchinfer shard`` splits it). Bytes per record come
from a sample at the largest part's start. A Parquet part is cut into whole row groups, planned from
its footer alone (every part's is read, :data:`FOOTER_READERS` at a time: its rows are exact, and a
corrupt one refuses the plan naming the file). Each shard is a
:class:`~airflow_batchinfer.storage.shard_ref.RangeRef` with ``pieces``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO, cast

from airflow_batchinfer.storage import taper
from airflow_batchinfer.storage.input_parts import InputParts, Part
from airflow_batchinfer.storage.location import Location, StorageOptions, resolve
from airflow_batchinfer.storage.parquet_rows import RowGroup, row_groups
from airflow_batchinfer.storage.plan_probe import (
    PLAN_BLOCK,
    SAMPLE,
    Counting,
    RangePlan,
    next_line_start,
    sample_rate,
    zstd_sample,
)
from airflow_batchinfer.storage.shard_ref import Piece, RangeRef
from airflow_batchinfer.storage.zstd_frames import Frame, zstd_frames

log = logging.getLogger("airflow_batchinfer.storage")
FOOTER_READERS = 16  # Parquet footers read at once while planning


class _Opener:
    """Opens parts for planning's probes, each for as long as it is probed (a plan over 100,000
    parts never holds them all open), and counts what they read (from several threads)."""

    def __init__(self, loc: Location) -> None:
        self.loc, self.bytes_read, self._lock = loc, 0, threading.Lock()

    @contextlib.contextmanager
    def open(self, part: Part) -> Iterator[BinaryIO]:
        with self.loc.fs.open(self.loc.at(part.uri).path, "rb", block_size=PLAN_BLOCK) as f:
            counting = Counting(f)
            try:
                raw: Any = counting  # a BinaryIO to what planning calls
                yield cast("BinaryIO", raw)
            finally:
                with self._lock:
                    self.bytes_read += counting.bytes_read


class _Cutter(ABC):
    """What is left of one part to plan: :meth:`take` cuts a piece of about ``want`` records off its
    front (at least a line, a frame or a row group), :meth:`rest` takes the remainder."""

    def __init__(self, part: Part, offset: int, opener: _Opener | None = None) -> None:
        self.part, self.offset, self.pos = part, offset, 0
        self._opener, self._stack = opener, contextlib.ExitStack()
        self._raw: BinaryIO | None = None

    def __enter__(self) -> _Cutter:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def file(self) -> BinaryIO:
        """The part, opened on first use for as long as it is being cut."""
        if self._raw is None:
            assert self._opener is not None
            self._raw = self._stack.enter_context(self._opener.open(self.part))
        return self._raw

    @property
    def done(self) -> bool:
        return self.pos >= self.part.size

    @abstractmethod
    def left(self) -> float: ...

    def unit(self) -> float:
        """The records of the smallest piece :meth:`take` can cut (0: a line, as good as none)."""
        return 0.0

    @abstractmethod
    def take(self, want: float) -> tuple[Piece, float]: ...

    @abstractmethod
    def rest(self) -> tuple[Piece, float]: ...

    def place(self, piece: Piece) -> tuple[int, int, int]:
        """The piece's place in the input (its stored bytes after those of the parts before it) and
        its bytes."""
        a, b = piece.range or (0, 0)
        return self.offset + a, self.offset + b, b - a


class _JsonlCutter(_Cutter):
    def __init__(self, part: Part, offset: int, per_record: float, opener: _Opener) -> None:
        super().__init__(part, offset, opener)
        self.per_record = per_record

    def left(self) -> float:
        return (self.part.size - self.pos) / self.per_record

    def _cut(self, end: int) -> tuple[Piece, float]:
        piece = Piece(uri=self.part.uri, version=self.part.version, range=(self.pos, end))
        n = (end - self.pos) / self.per_record
        self.pos = end
        return piece, n

    def take(self, want: float) -> tuple[Piece, float]:
        at = self.pos + max(1, round(want * self.per_record))
        size = self.part.size
        return self._cut(next_line_start(self.file(), at, size) if at < size else size)

    def rest(self) -> tuple[Piece, float]:
        return self._cut(self.part.size)


class _ZstdCutter(_Cutter):
    """A zstd part: estimated from its stored size (``ratio``: decoded bytes per stored byte) until it
    must be cut, then by its frames."""

    def __init__(self, part: Part, offset: int, per_record: float, ratio: float, opener: _Opener) -> None:
        super().__init__(part, offset, opener)
        self.per_record, self.ratio = per_record, ratio
        self.frames: list[Frame] | None = None
        self.i = 0  # the next frame
        self.before: Frame | None = None

    def _records(self, fr: Frame) -> float:
        content = fr.content if fr.content is not None else (fr.end - fr.start) * self.ratio
        return content / self.per_record

    def unit(self) -> float:
        return self._records(self.frames[self.i]) if self.frames and self.i < len(self.frames) else 0.0

    def left(self) -> float:
        if self.frames is None:
            return self.part.size * self.ratio / self.per_record
        return sum(self._records(fr) for fr in self.frames[self.i :])

    def _cut(self, j: int) -> tuple[Piece, float]:
        assert self.frames is not None
        group = self.frames[self.i : j]
        lead_in = (self.before.start, self.before.end) if self.before is not None else None
        span = (group[0].start, group[-1].end)
        piece = Piece(uri=self.part.uri, version=self.part.version, range=span, lead_in=lead_in)
        self.i, self.before, self.pos = j, group[-1], group[-1].end
        return piece, sum(map(self._records, group))

    def take(self, want: float) -> tuple[Piece, float]:
        if self.frames is None:
            self.frames = zstd_frames(self.file(), self.part.size, self.part.uri)
            self.pos = self.frames[0].start if self.frames else self.part.size
            if len(self.frames) < 2:
                return self.rest()
        j, n = self.i, 0.0
        while j < len(self.frames) and (j == self.i or n < want):
            n += self._records(self.frames[j])
            j += 1
        return self._cut(j)

    def rest(self) -> tuple[Piece, float]:
        if self.frames is None or self.i == 0:  # the whole part: no lead-in, however many frames
            n = self.left()
            self.pos = self.part.size
            return Piece(uri=self.part.uri, version=self.part.version, range=(0, self.part.size)), n
        return self._cut(len(self.frames))

    @property
    def single_frame(self) -> bool:
        return self.frames is not None and len(self.frames) < 2


class _ParquetCutter(_Cutter):
    """A Parquet part: whole row groups, its rows exact from its footer; ``offset`` counts rows."""

    def __init__(self, part: Part, offset: int, groups: list[RowGroup]) -> None:
        super().__init__(part, offset)
        self.rows = [g.rows for g in groups]
        self.bytes = [g.bytes for g in groups]
        self.starts = list(itertools.accumulate(self.rows, initial=0))
        self.i = 0

    @property
    def done(self) -> bool:
        return self.starts[self.i] >= self.starts[-1]

    def left(self) -> float:
        return self.starts[-1] - self.starts[self.i]

    def unit(self) -> float:
        return self.rows[self.i]

    def take(self, want: float) -> tuple[Piece, float]:
        j = self.i + 1
        while j < len(self.rows) and self.starts[j] - self.starts[self.i] < want:
            j += 1
        return self._cut(j)

    def rest(self) -> tuple[Piece, float]:
        return self._cut(len(self.rows))

    def _cut(self, j: int) -> tuple[Piece, float]:
        piece = Piece(uri=self.part.uri, version=self.part.version, rows=(self.i, j))
        n = self.starts[j] - self.starts[self.i]
        self.i = j
        return piece, n

    def place(self, piece: Piece) -> tuple[int, int, int]:
        """The piece's rows after those of the parts before it, and its row groups' bytes."""
        a, b = piece.rows or (0, 0)
        return self.offset + self.starts[a], self.offset + self.starts[b], sum(self.bytes[a:b])


def plan_parts(
    inp: InputParts,
    *,
    records_per_shard: int,
    max_bytes_per_shard: int,
    storage_options: StorageOptions | None = None,
    lanes: int = 0,
    min_records: float = taper.MIN_RECORDS,
) -> RangePlan:
    """Range shards with ``pieces`` over ``inp``'s parts (see the module)."""
    started = time.monotonic()
    loc = resolve(inp.root, storage_options)
    parts = [p for p in inp.parts if p.size > 0]
    opener = _Opener(loc)
    cutters: list[_Cutter]
    if inp.format == "parquet":
        cutters, per_record = _parquet_cutters(parts, opener)
    else:
        per_record, ratio = _sample(inp, parts, opener)
        offsets = itertools.accumulate((p.size for p in parts), initial=0)
        cutters = [
            _ZstdCutter(p, o, per_record, ratio, opener)
            if inp.format == "jsonl.zst"
            else _JsonlCutter(p, o, per_record / ratio, opener)
            for p, o in zip(parts, offsets, strict=False)
        ]
    full = max(1.0, min(records_per_shard, max_bytes_per_shard / per_record))
    groups, notices = _walk(cutters, full, lanes, min_records)
    shards = [_shard(i, inp.root, pieces, n) for i, (pieces, n) in enumerate(groups)]
    return RangePlan(shards, opener.bytes_read, time.monotonic() - started, notices)


def _footer(part: Part, opener: _Opener) -> list[RowGroup]:
    with opener.open(part) as raw:
        return row_groups(raw, part.size, part.uri)


def _parquet_cutters(parts: list[Part], opener: _Opener) -> tuple[list[_Cutter], float]:
    """A Parquet input's cutters, from every part's footer (read :data:`FOOTER_READERS` at a time: a
    request each on an object store), and its uncompressed bytes per row. A part whose footer is
    unreadable refuses the plan, naming it (:class:`~airflow_batchinfer.exceptions.CorruptFileError`)."""
    with ThreadPoolExecutor(FOOTER_READERS) as pool:
        footers = list(pool.map(lambda p: _footer(p, opener), parts))
    cutters: list[_Cutter] = []
    rows = stored = 0
    for part, groups in zip(parts, footers, strict=True):
        cutters.append(_ParquetCutter(part, rows, groups))
        rows += sum(g.rows for g in groups)
        stored += sum(g.bytes for g in groups)
    return cutters, max(1.0, stored / max(rows, 1))


def _sample(inp: InputParts, parts: list[Part], opener: _Opener) -> tuple[float, float]:
    """(decoded bytes per record, decoded bytes per stored byte) from the start of the largest part
    (a tiny part's compression ratio says little of the others')."""
    if not parts:
        return 1.0, 1.0
    part = max(parts, key=lambda p: p.size)
    with opener.open(part) as raw:
        if inp.format == "jsonl.zst":
            return zstd_sample(raw, Frame(0, part.size), part.uri)
        return sample_rate(raw.read(min(part.size, SAMPLE))), 1.0


Placed = tuple[Piece, tuple[int, int, int]]  # a piece, its place in the input and its bytes
Group = tuple[list[Placed], float]  # a shard's pieces, its records


def _walk(cutters: list[_Cutter], full: float, lanes: int, floor: float) -> tuple[list[Group], list[str]]:
    """The parts' pieces grouped into shards of about ``full`` records, the last ones tapered."""
    walk = _Walk(sum(c.left() for c in cutters), full, lanes, floor)
    for c in cutters:
        with c:  # its file, if cutting it opened one, closed once it is planned
            while not c.done:
                walk.step(c)
    walk.close()
    for note in walk.notices:
        log.warning("%s", note)
    return walk.groups, walk.notices


class _Walk:
    """The shard being filled (``cur``, ``n`` records of the ``want`` it takes) and those before it."""

    def __init__(self, left: float, full: float, lanes: int, floor: float) -> None:
        self.left, self.full, self.lanes, self.floor = left, full, lanes, floor
        self.groups: list[Group] = []
        self.notices: list[str] = []
        self.cur: list[Placed] = []
        self.n = 0.0
        self.want = taper.next_size(left, full, lanes, floor)

    def step(self, c: _Cutter) -> None:
        """One piece of ``c`` into the current shard, or the shard closed so that ``c`` starts the next
        (a part that does not fit, or whose smallest piece would overfill it)."""
        room = self.want - self.n
        if c.left() <= room:
            piece, k = c.rest()
        elif self.cur and (c.left() <= self.full or room < self.want / 8 or c.unit() > 1.5 * room):
            self.close()
            return
        else:
            piece, k = c.take(room)
            if isinstance(c, _ZstdCutter) and c.single_frame and k > 2 * self.full:
                self.notices.append(
                    f"{c.part.uri} is one zstd frame of about {round(k)} records: it cannot be cut, so "
                    "one lane reads it whole. Remedy: recompress it in frames (pzstd, or zstd "
                    "--seekable), or split it with `batchinfer shard`"
                )
        self.cur.append((piece, c.place(piece)))
        self.n += k
        if self.n >= self.want:
            self.close()

    def close(self) -> None:
        if not self.cur:
            return
        self.groups.append((self.cur, self.n))
        self.left = max(self.left - self.n, 0.0)
        self.cur, self.n = [], 0.0
        self.want = taper.next_size(self.left, self.full, self.lanes, self.floor)


def _shard(i: int, root: str, pieces: list[Placed], n: float) -> RangeRef:
    """One shard: its place in the input (its parts' stored bytes, or a Parquet input's rows, taken in
    order) and its pieces."""
    start, end = pieces[0][1][0], pieces[-1][1][1]
    return RangeRef(
        shard_id=f"part-{i:05d}",
        uri=root,
        records=max(1, round(n)),
        range=(start, max(end, start + 1)),
        bytes=sum(size for _, (_, _, size) in pieces),
        estimated=True,
        pieces=tuple(p for p, _ in pieces),
    )


@dataclass(frozen=True)
class InputSize:
    """What an input holds, for sizing a run before it (``batchinfer plan --input``): its parts,
    stored bytes and records (a Parquet input's exact, from its footers; else estimated from a
    sample at the largest part's start)."""

    parts: int
    bytes: int
    records: int
    exact: bool


def size_input(inp: InputParts, storage_options: StorageOptions | None = None) -> InputSize:
    """``inp``'s size: from its parts' footers (Parquet), else its stored bytes and one sample."""
    parts = [p for p in inp.parts if p.size > 0]
    opener = _Opener(resolve(inp.root, storage_options))
    if inp.format == "parquet":
        cutters, _ = _parquet_cutters(parts, opener)
        return InputSize(len(inp.parts), inp.size, round(sum(c.left() for c in cutters)), True)
    per_record, ratio = _sample(inp, parts, opener)
    records = round(inp.size * ratio / per_record) if parts else 0
    return InputSize(len(inp.parts), inp.size, records, False)
