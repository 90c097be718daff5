"""Round-0 shards as byte ranges of the input file, never copied: reading one range shard.
Planning them is :mod:`~airflow_batchinfer.storage.range_plan`'s.

A range shard's reference names the source and its stored bytes
(:class:`~airflow_batchinfer.storage.shard_ref.RangeRef`: ``records`` is an estimate, ``ids`` absent).
The job that reads the range validates each line exactly as sharding does
(:class:`~airflow_batchinfer.storage.validate.LineValidator`; repeated ids are found within the range),
writes bad lines with their ``line_in_range`` and byte ``offset`` to its ``input_rejects`` output
and records its line counts (its tally's ``read``) and ``ids["input"]``; the round's close turns those
into the run's ``rejects/`` rows with absolute line numbers (prefix sums of the ranges' line counts). The job
also writes the range's id hash file (:mod:`~airflow_batchinfer.storage.id_hash_files`), from which
round 0's close finds ids that two ranges hold without reading the input again.

With a fan-out (:mod:`~airflow_batchinfer.storage.fan_out`) a range's reference names its arms
(``fan_out``) and every reader of the range but the id hashes' yields each kept record once per
arm: ``records`` (and ``ids``) count those rows, planned ``records_per_shard / arms`` lines apart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_batchinfer.exceptions import ConfigError, StorageError
from airflow_batchinfer.storage.digest import record_ids
from airflow_batchinfer.storage.fan_out import FanOut
from airflow_batchinfer.storage.file_version import same_version, source_version
from airflow_batchinfer.storage.jsonl_file import JsonlFile
from airflow_batchinfer.storage.lines import (
    is_zstd,
    iter_chunks,
    iter_line_blocks,
)
from airflow_batchinfer.storage.location import StorageOptions
from airflow_batchinfer.storage.pieces import At, PieceRejects, check_piece, parquet_piece
from airflow_batchinfer.storage.reader import RecordReader, RecordSink
from airflow_batchinfer.storage.records import (
    Record,
    check_on_error,
)
from airflow_batchinfer.storage.shard_ref import Piece, RangeRef, ShardRef
from airflow_batchinfer.storage.unreadable import Unreadable
from airflow_batchinfer.storage.validate import LineValidator, RowBlock


@dataclass(frozen=True)
class InputRange:
    """What a job needs to read one range shard (``params["input_range"]`` of its spec)."""

    shard_id: str
    start: int
    end: int
    version: str
    id_field: str | None
    assign_ids: bool = False
    on_error: str = "quarantine"
    lead_in: list[int] | None = None  # zstd: the frame before the range (see range_chunks)
    # The plan's bounds (range plans record them; None: storage's defaults).
    max_line_bytes: int | None = None
    max_id_bytes: int | None = None
    # The fan-out's arms (storage.fan_out): each kept record is read once per arm.
    fan_out: tuple[str, ...] | None = None
    # A part input's range: the parts' spans it reads, in order (start and end: its place in them).
    pieces: tuple[Piece, ...] | None = None

    def as_params(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        for name in ("fan_out", "pieces"):  # none: the params (job ids, fingerprints) as before them
            if out[name] is None:
                del out[name]
        if self.fan_out is not None:
            out["fan_out"] = list(self.fan_out)
        if self.pieces is not None:
            out["pieces"] = [p.model_dump(mode="json") for p in self.pieces]
        return out

    @property
    def fanned(self) -> FanOut | None:
        """The range's fan-out (``None``: none)."""
        return None if self.fan_out is None else FanOut(self.fan_out)

    @classmethod
    def from_params(cls, value: Any, *, root: str | None = None) -> InputRange:
        """The range ``value`` describes, refused with a :class:`ConfigError` when it is none. ``root``:
        the job's input, which every piece must be a part under (see :func:`check_pieces`)."""
        try:
            rng = cls(**value)
            check_on_error(rng.on_error)
            arms = FanOut.of(rng.fan_out, "params.input_range.fan_out")
            pieces = None if rng.pieces is None else tuple(Piece.model_validate(p) for p in rng.pieces)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"params.input_range is not a range shard's description ({exc})") from None
        if pieces is not None:
            if root is not None:
                check_pieces(root, pieces)
            rng = dataclasses.replace(rng, pieces=pieces)
        if arms is not None:
            rng = dataclasses.replace(rng, fan_out=arms.arms)
        if not (isinstance(rng.start, int) and isinstance(rng.end, int) and 0 <= rng.start < rng.end):
            raise ConfigError(f"params.input_range [{rng.start}, {rng.end}) is not a byte range")
        for name in ("max_line_bytes", "max_id_bytes"):
            bound = getattr(rng, name)
            if bound is not None and (type(bound) is not int or bound < 1):
                raise ConfigError(f"params.input_range.{name} must be a whole number >= 1, got {bound!r}")
        return rng


def check_pieces(root: str, pieces: tuple[Piece, ...]) -> None:
    """Refuse a piece that is not a part under the range's ``root`` (its job's input; one file is its
    own root): pieces are opened on the root's filesystem
    (:meth:`~airflow_batchinfer.storage.location.Location.at`), so one of another scheme or outside
    it would be read as a path where it was not planned. ``.`` and ``..`` segments are refused."""
    base = root.rstrip("/")
    for piece in pieces:
        rel = piece.uri[len(base) + 1 :] if piece.uri.startswith(base + "/") else None
        if piece.uri == root or (rel and all(s not in ("", ".", "..") for s in rel.split("/"))):
            continue
        raise ConfigError(
            f"params.input_range: piece {piece.uri} is not a part under the range's input {root} (a "
            "part input's pieces are its parts, under its root on the same filesystem). Remedy: "
            "submit the range shard's job as its plan describes it"
        )


def piece_uris(params: Mapping[str, Any]) -> list[str]:
    """The part files a job's ``params.input_range`` reads besides its input (a part input's range):
    a worker checks them against its prefixes as it checks the input. Not a range's description:
    none here (parsing the params refuses it)."""
    rng = params.get("input_range") if isinstance(params, Mapping) else None
    pieces = rng.get("pieces") if isinstance(rng, Mapping) else None
    if not isinstance(pieces, list):
        return []
    return [str(p.get("uri")) for p in pieces if isinstance(p, Mapping)]


def range_params(shard: ShardRef | RangeRef, *, id_field: str | None, assign_ids: bool) -> dict[str, Any]:
    """A job's ``params`` for reading ``shard``: ``input_range`` for a range shard, else nothing."""
    if not isinstance(shard, RangeRef):
        return {}
    return {"input_range": _input_range(shard, id_field, assign_ids).as_params()}


def _input_range(shard: RangeRef, id_field: str | None, assign_ids: bool) -> InputRange:
    return InputRange(
        shard.shard_id,
        shard.start,
        shard.end,
        shard.version or "",
        id_field,
        assign_ids,
        lead_in=list(shard.lead_in) if shard.lead_in is not None else None,
        max_line_bytes=shard.max_line_bytes,
        max_id_bytes=shard.max_id_bytes,
        fan_out=shard.fan_out or None,
        pieces=shard.pieces,
    )


def assigned_id(name: str, rng: InputRange, compressed: bool) -> Callable[[int, int], str]:
    """Ids for records without one in a range shard (``assign_ids``): absolute line numbers are not
    known inside a range, so the id names the line's byte offset: ``<file name>@<offset>`` in a plain
    file, ``<file name>@<frame offset>+<decoded offset>`` in a zstd file (the stored offset of the
    shard's first frame, and the line's offset in the decoded bytes from the shard's first line)."""
    if compressed:
        return lambda _line, offset: f"{name}@{rng.start}+{offset}"
    return lambda _line, offset: f"{name}@{rng.start + offset}"


def range_chunks(file: JsonlFile, rng: InputRange) -> Iterator[bytes]:
    """The decoded bytes of the lines a range owns: those that *start* in it.

    A plain range starts and ends at line starts (planning moved it there). zstd frames need not
    end at a line (``pzstd`` cuts every few MiB): a range whose lead-in frame does not end with a
    newline skips its first partial line (the previous range owns it), and a range that does not
    end with a newline reads on into the next frame until its last line ends."""
    if not file.compressed:
        yield from _decoded(file, rng.start, rng.end)
        return
    skip = False
    if rng.lead_in:
        last = b"\n"
        for chunk in _decoded(file, *rng.lead_in):
            last = chunk[-1:] or last
        skip = last != b"\n"
    last = b"\n"
    for chunk in _decoded(file, rng.start, rng.end):
        if skip:
            i = chunk.find(b"\n")
            if i < 0:
                continue
            skip, chunk = False, chunk[i + 1 :]
        if chunk:
            last = chunk[-1:]
            yield chunk
    if skip or last == b"\n":
        return
    size = int(file.info().get("size") or 0)  # asked only when the last line reads on
    for chunk in _decoded(file, rng.end, size) if rng.end < size else ():  # the rest of the last line
        i = chunk.find(b"\n")
        if i >= 0:
            yield chunk[: i + 1]
            return
        yield chunk


def _decoded(file: JsonlFile, start: int, end: int) -> Iterator[bytes]:
    """The decoded chunks of stored bytes ``[start, end)`` (:meth:`JsonlFile.open_raw`: ranged reads,
    the file closed with the generator)."""
    with JsonlFile(file.loc, byte_range=(start, end)).open_raw() as raw:
        yield from iter_chunks(raw, zstd=file.compressed, source=file.uri)


class RangeRecordReader(RecordReader):
    """The records of one range shard, validated as sharding validates them (bad lines go to
    ``rejects`` with ``line_in_range`` and ``offset``; ``line_no`` is the line within the range until
    the round's close makes it absolute). Refuses a source whose version is not the planned one.
    ``finish(ok)`` is called once: ``True`` after the last line, ``False`` when the read stops early
    (an error, or a consumer that closed it), e.g. to commit or abort the rejects writer.
    ``keep(id, line_in_range)`` is called for each kept record as it is read (its input id). A range
    with a fan-out yields each kept record once per arm, unless ``expand`` is false (its lines' records,
    as the id hash files hold them)."""

    def __init__(
        self,
        file: JsonlFile,
        rng: InputRange,
        *,
        rejects: RecordSink | None,
        finish: Callable[[bool], None] | None = None,
        keep: Callable[[Any, int], None] | None = None,
        expand: bool = True,
    ) -> None:
        self.file = JsonlFile(file.loc, byte_range=(rng.start, rng.end), max_line_bytes=rng.max_line_bytes)
        self._at: At | None = None  # the piece being read (a part input's range)
        if rng.pieces and rejects is not None:
            rejects = PieceRejects(rejects, lambda: self._at)
        super().__init__(file.uri, self.file.iter_lines, on_error=rng.on_error, rejects=rejects)
        self.range = rng
        assign: Callable[[int, int], str] | None = None
        if rng.assign_ids:
            assign = self._piece_id if rng.pieces else assigned_id(file.loc.name, rng, file.compressed)
        fan_out = rng.fanned
        self.check = LineValidator(
            self.policy,
            id_field=rng.id_field,
            assign=assign,
            offsets=True,
            max_id_bytes=rng.max_id_bytes,
            fan_out=fan_out,
        )
        self.fan_out = fan_out if expand else None
        self._finish = finish
        self._keep = keep
        self._skip = False  # skip a piece that cannot be read (until_unreadable), naming it
        self.unreadable: list[Unreadable] = []  # the pieces until_unreadable() could not read

    def line_of(self, value: Any) -> int:
        """The line in the range of the kept record with id ``value`` (read already): the validator
        keeps every id of a range with its line (``window=None``) to find repeats."""
        return self.check.line_of(value)

    def check_version(self) -> None:
        now = source_version(self.file.info())
        if self.range.version and not same_version(self.range.version, now):
            raise StorageError(
                f"shard {self.range.shard_id}: {self.file.uri} changed since the run was sharded "
                f"(planned for version {self.range.version}, now {now}), so its byte range "
                f"[{self.range.start}, {self.range.end}) may no longer start at a line (on local disk, "
                "its inode and ctime count: a copy over it, or a chmod, changes them). Remedy: keep an "
                "input unchanged while its run lives, or start a new run (another run root) over it."
            )

    def _blocks(self) -> Iterator[list[bytes] | RowBlock]:
        """The range's lines in blocks: its bytes of the file, or each piece's of its part in turn
        (each part's version checked first; a part's last line ends with the part)."""
        bound = self.range.max_line_bytes
        if not self.range.pieces:
            self.check_version()
            yield from iter_line_blocks(range_chunks(self.file, self.range), strip_cr=False, max_line=bound)
            return
        for piece in self.range.pieces:
            try:
                yield from self._piece_blocks(piece)
            except StorageError as exc:
                if not self._skip:
                    raise
                self._skipped(piece, exc)

    def _piece_blocks(self, piece: Piece) -> Iterator[list[bytes] | RowBlock]:
        """One piece's lines in blocks, its part's version checked first."""
        bound = self.range.max_line_bytes
        part = JsonlFile(self.file.loc.at(piece.uri), max_line_bytes=bound)
        size = check_piece(part, piece, self.range.shard_id)
        at = At(piece, self._part_name(piece), self.check.line_no, self.check.offset)
        if piece.rows is not None:  # Parquet: whole row groups, read in blocks of rows

            def started(starts: tuple[int, ...], at: At = at) -> None:
                self._at = dataclasses.replace(at, starts=starts)

            yield from parquet_piece(part, piece, size, started)
            return
        self._at = at
        span = piece.range or (0, 0)
        sub = dataclasses.replace(
            self.range, start=span[0], end=span[1], lead_in=_listed(piece.lead_in), pieces=None
        )
        yield from iter_line_blocks(range_chunks(part, sub), strip_cr=False, max_line=bound)

    def part_line(self, line: int) -> tuple[str | None, int | None]:
        """The part the range's ``line`` (just read) is in, and its line there when known
        (:meth:`~airflow_batchinfer.storage.pieces.At.part_line`); ``(None, None)`` for one file's."""
        at = self._at
        return (None, None) if at is None else (at.piece.uri, at.part_line(line))

    def _part_name(self, piece: Piece) -> str:
        if piece.uri == self.file.uri:  # one Parquet file, its own root: its name, as one file's ids
            return self.file.loc.name
        root = self.file.uri.rstrip("/") + "/"
        return piece.uri[len(root) :] if piece.uri.startswith(root) else piece.uri

    def _piece_id(self, line: int, offset: int) -> str:
        """An assigned id in a part input: ``<part path>@<offset>`` as in one file (see
        :func:`assigned_id`), the part's path under the input's root; a Parquet row's
        ``<part path>#<row>`` (its row in the file, from 1)."""
        at = self._at
        assert at is not None
        if at.starts is not None:
            return f"{at.name}#{at.part_line(line)}"
        start = (at.piece.range or (0, 0))[0]
        if is_zstd(at.piece.uri):
            return f"{at.name}@{start}+{offset - at.offset}"
        return f"{at.name}@{start + offset - at.offset}"

    def __iter__(self) -> Generator[Record, None, None]:
        ok = False
        try:
            for block in self._blocks():
                _, ids, records = self.check.check_block(block)
                if self._keep is not None:  # e.g. the job's id hash file (storage.id_hash_files)
                    for value in ids:
                        self._keep(value, self.line_of(value))
                if self.fan_out is not None:
                    yield from self.fan_out.expand(records, self.check.id_field or "id")
                else:
                    yield from records
            ok = True
        finally:
            if self._finish is not None:
                finish, self._finish = self._finish, None
                finish(ok)

    def until_unreadable(self) -> Generator[Record, None, None]:
        """Its records but those of pieces that cannot be read: a corrupt row group or zstd frame, or a
        part changed or gone since planning (:class:`StorageError`, its
        :class:`~airflow_batchinfer.exceptions.CorruptFileError` included). Such a piece is read up to
        there and skipped, named in :attr:`unreadable`; one file's range stops there. For reads of a
        quarantined range (its job failed there): what can be read is accounted for."""
        self._skip = True
        try:
            yield from self
        except StorageError as exc:  # one file's range: no piece after it
            span = (self.range.start, self.range.end)
            self.unreadable.append(Unreadable(self.file.uri, None, span, None, str(exc)))

    def _skipped(self, piece: Piece, exc: StorageError) -> None:
        """A piece read up to ``exc``: named, and a Parquet piece's unread rows (from its footer) still
        numbered, so the lines after it keep their numbers (a byte range's count is unknown)."""
        at, left = self._at, None
        if piece.rows is not None and at is not None and at.piece == piece and at.starts is not None:
            left = at.starts[-1] - at.starts[0] - (self.check.line_no - at.line)
            self.check.line_no += left
            self.stats.lines += left
        self.unreadable.append(Unreadable(piece.uri, piece.rows, piece.range, left, str(exc)))


def _listed(span: tuple[int, int] | None) -> list[int] | None:
    return None if span is None else list(span)


class DiscardRejects:
    """A rejects sink that keeps nothing: for reads of a range after its job (and round 0's close)
    quarantined its bad lines (the pre-flight sample, the accounting's read of a range's ids)."""

    def write(self, record: Record) -> None:
        pass


def range_ids(
    shard: RangeRef,
    *,
    id_field: str | None,
    assign_ids: bool,
    storage_options: StorageOptions | None,
) -> Iterator[Any]:
    """The ids of one range shard's records (its rows, with a fan-out), read and validated as its job
    read them."""
    reader = read_range(
        shard,
        id_field=id_field,
        assign_ids=assign_ids,
        rejects=DiscardRejects(),
        storage_options=storage_options,
    )
    yield from record_ids(reader, reader.check.id_field or id_field or "id")


def read_range(
    shard: RangeRef,
    *,
    id_field: str | None,
    assign_ids: bool,
    rejects: RecordSink | None,
    storage_options: StorageOptions | None = None,
    expand: bool = True,
) -> RangeRecordReader:
    """A validating reader over one range shard (the round's close reads a range whose
    job never completed with it, to account for its ids, lines and rejects). ``expand``: yield a
    fan-out's rows (else its lines' records)."""
    rng = _input_range(shard, id_field, assign_ids)
    file = JsonlFile(shard.uri, storage_options=storage_options)
    return RangeRecordReader(file, rng, rejects=rejects, expand=expand)
