"""Round-0 shards as byte ranges of the input file: planned from a few small reads, never copied.

Planning (the run's first task) stats the source and reads O(shards) small pieces of it:

- plain JSONL: boundaries about ``records_per_shard`` records apart (bytes per record estimated
  from the first :data:`SAMPLE` bytes), each moved to the next line start by a ranged read;
- multi-frame zstd: whole frames grouped into shards, found from a seekable-format seek table (one
  read), pzstd's frame-size skippable frames (one read per frame) or else the frames' block
  headers (a few bytes per 128 KiB block: cheap locally; on S3 it reads the compressed file once,
  hence the README's advice to use ``pzstd`` or the seekable format);
- a single-frame zstd file cannot be split: :func:`plan_ranges` returns ``None`` and the caller
  copies it into shards (:func:`~airflow_batchinfer.storage.sharding.shard_dataset`).

A range shard's descriptor names the source and its stored bytes (:class:`ShardDescriptor` with
``range``, ``bytes``, ``version`` and ``estimated``: ``records`` is an estimate, ``ids`` absent).
The job that reads the range validates each line exactly as sharding does
(:class:`~airflow_batchinfer.storage.validate.LineValidator`; repeated ids are found within the range),
writes bad lines with their ``line_in_range`` and byte ``offset`` to its ``input_rejects`` output
and records its line counts (its tally's ``read``) and ``ids["input"]``; the round's close turns those
into the run's ``rejects/`` rows with absolute line numbers (prefix sums of the ranges' line counts). The job
also writes the range's id hash file (:mod:`~airflow_batchinfer.storage.id_hashes`), from which
round 0's close finds ids that two ranges hold without reading the input again.

With a fan-out (:mod:`~airflow_batchinfer.storage.fan_out`) a range's descriptor names its arms
(``fan_out``) and every reader of the range but the id hashes' yields each kept record once per
arm: ``records`` (and ``ids``) count those rows, planned ``records_per_shard / arms`` lines apart.
"""

from __future__ import annotations

import dataclasses
import itertools
import struct
import time
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

import zstandard

from airflow_batchinfer.exceptions import ConfigError, CorruptFileError, OutputExistsError, StorageError
from airflow_batchinfer.storage import taper
from airflow_batchinfer.storage.digest import record_ids
from airflow_batchinfer.storage.fan_out import FanOut
from airflow_batchinfer.storage.jsonl_dir import JsonlDir, ShardDescriptor
from airflow_batchinfer.storage.jsonl_file import JsonlFile
from airflow_batchinfer.storage.lines import (
    FEED_SIZE,
    MAX_LINE_BYTES,
    OversizedLine,
    RangeReader,
    iter_chunks,
    iter_line_blocks,
)
from airflow_batchinfer.storage.location import StorageOptions, join, parent
from airflow_batchinfer.storage.manifest import claim_output, read_manifest, write_manifest
from airflow_batchinfer.storage.reader import RecordReader, RecordSink
from airflow_batchinfer.storage.records import (
    MAX_ID_BYTES,
    OnError,
    Record,
    RecordError,
    check_on_error,
    parse_record,
)
from airflow_batchinfer.storage.sharding import bounds_fingerprint
from airflow_batchinfer.storage.validate import LineValidator, detect_id_field

SAMPLE = 256 * 1024  # bytes read from the start to estimate bytes per record
FIRST_PROBE = 4 * 1024  # bytes of the first read looking for the next line start
PROBE = 64 * 1024  # the most bytes per such read (a long line takes several)
PLAN_BLOCK = 256 * 1024  # fsspec block size while planning: small reads stay small

ZSTD_MAGIC = 0xFD2FB528
SKIPPABLE_MASK, SKIPPABLE_MAGIC = 0xFFFFFFF0, 0x184D2A50
PZSTD_MAGIC = 0x184D2A50  # pzstd: a 4-byte skippable frame before each frame holds its compressed size
SEEKABLE_MAGIC = 0x8F92EAB1  # zstd seekable format: the seek table's footer ends with it


def source_version(info: Mapping[str, Any]) -> str:
    """``size:ETag-or-mtime``: the version a range plan is valid for (as ``pin_input`` pins jobs)."""
    return f"{info.get('size')}:{info.get('ETag') or info.get('mtime') or info.get('LastModified') or ''}"


# ------------------------------------------------------------------------------------ planning
def line_ranges(
    raw: BinaryIO, size: int, target: int, lanes: int = 0, floor: float = 0.0
) -> list[tuple[int, int]]:
    """``[start, end)`` ranges of about ``target`` bytes covering ``[0, size)`` exactly once, each
    starting at a line start (offset 0 or just after a ``\\n``), the last ones tapered for ``lanes``
    lanes down to ``floor`` bytes (:mod:`~airflow_batchinfer.storage.taper`; 0: none). A line longer
    than ``target`` makes its range longer; ranges are never empty."""
    bounds = [0]
    while (b := bounds[-1] + max(1, round(taper.next_size(size - bounds[-1], target, lanes, floor)))) < size:
        nxt = next_line_start(raw, b, size)
        if nxt >= size:
            break
        bounds.append(nxt)
    bounds.append(size)
    return [(a, b) for a, b in itertools.pairwise(bounds) if b > a]


def next_line_start(raw: BinaryIO, pos: int, size: int) -> int:
    """The first line start at or after ``pos`` (``size`` when none), in ranged reads of at most
    :data:`PROBE` bytes."""
    at = pos - 1  # a "\n" just before pos makes pos itself a line start
    probe = FIRST_PROBE  # most lines are short: a small read first, doubling for long ones
    while at < size:
        raw.seek(at)
        chunk = raw.read(probe)
        if not chunk:
            break
        i = chunk.find(b"\n")
        if i >= 0:
            return at + i + 1
        at += len(chunk)
        probe = min(2 * probe, PROBE)
    return size


@dataclass(frozen=True)
class Frame:
    """Stored bytes ``[start, end)`` holding one zstd frame (with any skippable frames before it);
    ``content`` is its decoded size when the frame header says."""

    start: int
    end: int
    content: int | None = None


def zstd_frames(raw: BinaryIO, size: int, source: str) -> list[Frame]:
    """The data frames of a zstd file, each with the skippable frames before it (a trailing seek
    table joins the last). From a seekable-format seek table when there is one, else by walking
    frame and block headers (pzstd's size frames let the walk jump over whole frames)."""
    table = _seek_table(raw, size)
    if table is not None:
        return table
    frames: list[Frame] = []
    pos = start = 0
    jump: int | None = None  # a pzstd size frame told where the next frame ends
    while pos < size:
        raw.seek(pos)
        head = raw.read(18)
        if len(head) < 8:
            raise CorruptFileError(f"{source}: truncated zstd frame at byte {pos}. Regenerate the file.")
        (magic,) = struct.unpack_from("<I", head)
        if magic & SKIPPABLE_MASK == SKIPPABLE_MAGIC:
            (length,) = struct.unpack_from("<I", head, 4)
            if magic == PZSTD_MAGIC and length == 4 and len(head) >= 12:
                jump = pos + 12 + struct.unpack_from("<I", head, 8)[0]
            pos += 8 + length
            continue
        if magic != ZSTD_MAGIC:
            raise CorruptFileError(f"{source}: no zstd frame at byte {pos}: not zstd, or damaged.")
        content, header = _frame_header(head, source, pos)
        if jump is not None and jump > pos:
            pos, jump = jump, None
        else:
            pos = _walk_blocks(raw, pos + header, head[4], source)
        frames.append(Frame(start, pos, content))
        start = pos
    if start < size and frames:  # trailing skippable frames (a seek table)
        frames[-1] = Frame(frames[-1].start, size, frames[-1].content)
    return frames


def _frame_header(head: bytes, source: str, pos: int) -> tuple[int | None, int]:
    """(decoded size if stated, header length) of the frame whose first bytes are ``head``."""
    fhd = head[4]
    fcs_flag, single, did_flag = fhd >> 6, (fhd >> 5) & 1, fhd & 3
    did = (0, 1, 2, 4)[did_flag]
    fcs = (1 if single else 0, 2, 4, 8)[fcs_flag]
    at = 5 + (0 if single else 1) + did
    if len(head) < at + fcs:
        raise CorruptFileError(f"{source}: truncated zstd frame header at byte {pos}. Regenerate the file.")
    content = int.from_bytes(head[at : at + fcs], "little") if fcs else None
    if content is not None and fcs == 2:
        content += 256
    return content, at + fcs


def _walk_blocks(raw: BinaryIO, pos: int, fhd: int, source: str) -> int:
    """The end of a frame whose blocks start at ``pos``: block headers are 3 bytes, so this reads a
    few bytes per block (at most 128 KiB of frame each)."""
    while True:
        raw.seek(pos)
        b = raw.read(3)
        if len(b) < 3:
            raise CorruptFileError(f"{source}: zstd frame truncated at byte {pos}. Regenerate the file.")
        header = int.from_bytes(b, "little")
        last, kind, length = header & 1, (header >> 1) & 3, header >> 3
        if kind == 3:
            raise CorruptFileError(f"{source}: invalid zstd block at byte {pos}. Regenerate the file.")
        pos += 3 + (1 if kind == 1 else length)
        if last:
            return pos + (4 if fhd & 4 else 0)  # the content checksum


def _seek_table(raw: BinaryIO, size: int) -> list[Frame] | None:
    """Frames from a zstd seekable-format seek table (the file's last skippable frame), if any."""
    if size < 17:
        return None
    raw.seek(size - 9)
    foot = raw.read(9)
    n, desc, magic = struct.unpack("<IBI", foot)
    if magic != SEEKABLE_MAGIC:
        return None
    entry = 12 if desc & 0x80 else 8
    table_size = n * entry + 9
    if size < table_size + 8:
        return None
    raw.seek(size - table_size)
    table = raw.read(table_size)
    frames, pos = [], 0
    for i in range(n):
        csize, dsize = struct.unpack_from("<II", table, i * entry)
        frames.append(Frame(pos, pos + csize, dsize))
        pos += csize
    if frames:
        frames[-1] = Frame(frames[-1].start, size, frames[-1].content)
    return frames


def _sample_rate(head: bytes) -> float:
    """Bytes per record in a decoded sample (a whole-file sample counts a last unterminated line)."""
    lines = head.count(b"\n")
    return max(1.0, len(head) / max(lines, 1))


def _zstd_sample(raw: BinaryIO, frame: Frame, source: str) -> tuple[float, float]:
    """(bytes per record, decoded bytes per stored byte) from decoding the start of ``frame`` in
    small pieces (so the stored bytes counted are about those the sample needed)."""
    dctx = zstandard.ZstdDecompressor()
    dobj = dctx.decompressobj()
    reader = RangeReader(raw, frame.start, frame.end)
    out: list[bytes] = []
    decoded = used = 0
    try:
        while decoded < SAMPLE and (piece := reader.read(FEED_SIZE)):  # small: see FEED_SIZE
            used += len(piece)
            while piece:
                data = dobj.decompress(piece)
                out.append(data)
                decoded += len(data)
                if not dobj.eof:
                    break
                piece, dobj = dobj.unused_data, dctx.decompressobj()
    except zstandard.ZstdError as exc:
        raise CorruptFileError(f"{source}: invalid zstd data ({exc}). Regenerate the file.") from exc
    return _sample_rate(b"".join(out)), (decoded / used if used else 1.0)


@dataclass(frozen=True)
class RangePlan:
    """Shards of one source as byte ranges, and what planning read to make them."""

    shards: list[ShardDescriptor]
    bytes_read: int
    seconds: float


def plan_ranges(
    src: str,
    *,
    records_per_shard: int,
    max_bytes_per_shard: int,
    storage_options: StorageOptions | None = None,
    lanes: int = 0,
    min_records: float = taper.MIN_RECORDS,
) -> RangePlan | None:
    """Byte-range shards of ``src`` (see the module doc), or ``None`` when it cannot be split (a
    single-frame zstd file): the caller then copies it into shards. ``lanes``: the last ranges
    taper for that many lanes (:mod:`~airflow_batchinfer.storage.taper`; 0: none), never below
    ``min_records`` records (lines)."""
    started = time.monotonic()
    f = JsonlFile(src, storage_options=storage_options)
    info = f.info()
    size = int(info.get("size") or 0)
    version = source_version(info)
    with f.loc.fs.open(f.loc.path, "rb", block_size=PLAN_BLOCK) as opened:
        raw: Any = _Counting(opened)  # a BinaryIO to what planning calls
        if f.compressed:
            frames = zstd_frames(raw, size, f.uri) if size else []
            if len(frames) < 2:
                return None
            per_record, ratio = _zstd_sample(raw, frames[0], f.uri)
            ranges, estimates, lead_ins = _group_frames(
                frames, per_record, ratio, records_per_shard, max_bytes_per_shard, lanes, min_records
            )
        else:
            raw.seek(0)
            head = raw.read(min(size, SAMPLE))
            per_record = _sample_rate(head)
            target = max(1, min(max_bytes_per_shard, round(records_per_shard * per_record)))
            # the floor in the target's bytes: decided in records, so a shard at the floor keeps its size
            floor = target * taper.finest(records_per_shard, min_records) / records_per_shard
            ranges = line_ranges(raw, size, target, lanes, floor)
            estimates = [max(1, round((b - a) / per_record)) for a, b in ranges]
            lead_ins = [None] * len(ranges)
    shards = []
    for i, ((a, b), n, lead_in) in enumerate(zip(ranges, estimates, lead_ins, strict=True)):
        desc = ShardDescriptor(
            shard_id=f"part-{i:05d}",
            uri=f.uri,
            records=n,
            range=[a, b],
            bytes=b - a,
            version=version,
            estimated=True,
        )
        if lead_in is not None:
            desc["lead_in"] = lead_in
        shards.append(desc)
    return RangePlan(shards, raw.bytes_read, time.monotonic() - started)


def _group_frames(
    frames: list[Frame],
    per_record: float,
    ratio: float,
    records_per_shard: int,
    max_bytes: int,
    lanes: int = 0,
    min_records: float = taper.MIN_RECORDS,
) -> tuple[list[tuple[int, int]], list[int], list[list[int] | None]]:
    """Consecutive frames grouped into about ``records_per_shard`` records (or ``max_bytes`` decoded;
    the last groups tapered for ``lanes`` lanes), each group with its lead-in: the stored bytes of the
    frame before it (see :func:`range_chunks`)."""
    ranges: list[tuple[int, int]] = []
    estimates: list[int] = []
    lead_ins: list[list[int] | None] = []

    def content(fr: Frame) -> float:
        return fr.content if fr.content is not None else (fr.end - fr.start) * ratio

    left = sum(map(content, frames)) / per_record  # records not yet in a group
    want = taper.next_size(left, records_per_shard, lanes, min_records)
    start, decoded, before = frames[0].start, 0.0, None
    for i, fr in enumerate(frames):
        decoded += content(fr)
        last = i == len(frames) - 1
        if last or decoded / per_record >= want or decoded >= max_bytes:
            ranges.append((start, fr.end))
            estimates.append(max(1, round(decoded / per_record)))
            lead_ins.append(before)
            left -= decoded / per_record
            want = taper.next_size(left, records_per_shard, lanes, min_records)
            start, decoded, before = fr.end, 0.0, [fr.start, fr.end]
    return ranges, estimates, lead_ins


class _Counting:
    """A seekable binary file that counts the bytes read through it (planning's cost, for bench)."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self.bytes_read = 0

    def seek(self, pos: int) -> int:
        return self._raw.seek(pos)

    def read(self, n: int = -1) -> bytes:
        data = self._raw.read(n)
        self.bytes_read += len(data)
        return data


def shard_ranges(
    src: str,
    dst: str,
    *,
    records_per_shard: int,
    max_bytes_per_shard: int,
    id_field: str | None,
    assign_ids: bool,
    on_error: OnError | str = "quarantine",
    rejects: str | None = None,
    storage_options: StorageOptions | None = None,
    overwrite: bool = False,
    max_line_bytes: int = MAX_LINE_BYTES,
    max_id_bytes: int = MAX_ID_BYTES,
    fan_out: FanOut | None = None,
    lanes: int = 0,
) -> tuple[list[ShardDescriptor], dict[str, Any], bool] | None:
    """Plan ``src`` as range shards and record the plan in ``dst``'s manifest (``kind: ranges``),
    claiming ``dst`` and ``rejects`` as :func:`~airflow_batchinfer.storage.sharding.shard_dataset`
    does. Returns ``(shards, manifest, reused)``, or ``None`` when ``src`` cannot be split. Each
    shard carries ``max_line_bytes`` and ``max_id_bytes``, so every reader of a range (its job, the
    close, the pre-flight) validates it with the same bounds. With ``fan_out`` each shard names its
    arms too, holds about ``records_per_shard / arms`` lines, and its ``records`` count its rows (the
    manifest's ``counts`` stay the input's: its lines' records). ``lanes``: the round's lanes, for
    which the last ranges taper (:mod:`~airflow_batchinfer.storage.taper`; recorded as the
    manifest's ``taper_lanes``, not in its fingerprint: a complete plan is reused whatever the
    lanes)."""
    out = JsonlDir(dst, storage_options=storage_options)
    rejects_dir = JsonlDir(rejects or join(parent(out.uri), "rejects"), storage_options=storage_options)
    source = JsonlFile(src, storage_options=storage_options, max_line_bytes=max_line_bytes)
    fingerprint = {
        "source": source.uri,
        "version": source_version(source.info()),
        "records_per_shard": records_per_shard,
        "max_bytes_per_shard": max_bytes_per_shard,
        "id_field": id_field,
        "assign_ids": assign_ids,
        "on_error": on_error,
        "rejects": rejects_dir.uri,
        **bounds_fingerprint(max_line_bytes, max_id_bytes),
        **({"fan_out": fan_out.as_json()} if fan_out is not None else {}),  # none: as before fan-outs
    }
    earlier = read_manifest(out)
    detected = earlier is not None and (earlier.get("fingerprint") or {}).get("id_field") is None
    if detected and earlier is not None and id_field is not None and id_field == earlier.get("id_field"):
        fingerprint["id_field"] = None  # the field the earlier plan detected, now named: the same plan
    if earlier is not None and earlier.get("kind") == "shard" and not overwrite:
        return None  # copied shards (unsplittable input): sharding reuses or refuses them itself
    if (
        earlier is not None
        and earlier.get("kind") == "ranges"
        and earlier.get("state") == "complete"
        and earlier.get("fingerprint") != fingerprint
        and not overwrite
    ):
        # Its rounds read ranges of the file as it was: a new plan over a changed file would mix them.
        was = earlier.get("fingerprint") or {}
        raise OutputExistsError(
            f"{out.uri} holds the range plan of {was.get('source')} (version {was.get('version')}), but the "
            f"input is now {source.uri} (version {fingerprint['version']}) or other sharding settings: the "
            "run's rounds read the file as it was. Remedy: restore the file, or start a new run (another "
            "run_name) over the new one."
        )
    done = claim_output(out, kind="ranges", fingerprint=fingerprint, overwrite=overwrite)
    if done is not None:
        return done["shards"], done, True
    arms = len(fan_out.arms) if fan_out is not None else 1
    plan = plan_ranges(
        src,
        records_per_shard=-(-records_per_shard // arms),  # lines: each is ``arms`` rows
        max_bytes_per_shard=max_bytes_per_shard,
        storage_options=storage_options,
        lanes=lanes,
        min_records=taper.MIN_RECORDS / arms,  # lines: the floor counts rows
    )
    if plan is None:
        write_manifest(out, {"kind": "ranges", "state": "unsplittable", "fingerprint": fingerprint})
        return None
    claim_output(rejects_dir, kind="shard-rejects", fingerprint=fingerprint, overwrite=overwrite, reuse=False)
    if id_field is None:  # as sharding does: from the first record (custom_id for OpenAI batch input)
        id_field = _first_id_field(source)
    estimated = sum(s["records"] for s in plan.shards)
    for shard in plan.shards:
        shard["max_line_bytes"], shard["max_id_bytes"] = max_line_bytes, max_id_bytes
        if fan_out is not None:
            shard["records"] *= arms
            shard["fan_out"] = fan_out.as_json()
    manifest = {
        "kind": "ranges",
        "state": "complete",
        "fingerprint": fingerprint,
        "shards": plan.shards,
        # Known once round 0's close has read every range (it fills these in, and each shard's ids).
        "counts": {"records": estimated, "estimated": 1},
        "id_field": id_field,
        "rejects_uri": rejects_dir.uri,
        "planning": {"bytes_read": plan.bytes_read, "seconds": round(plan.seconds, 3)},
        "taper_lanes": lanes,
    }
    write_manifest(out, manifest)
    return plan.shards, manifest, False


def _first_id_field(source: JsonlFile) -> str:
    """:func:`detect_id_field` of the first record among the first lines (a short read)."""
    for _, line in itertools.islice(source.iter_lines(), 1000):
        if type(line) is OversizedLine:  # its first bytes are not the record
            continue
        try:
            return detect_id_field(parse_record(line))
        except RecordError:
            continue
    return "id"


# ------------------------------------------------------------------------------------- reading
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
    # The plan's bounds (None: a plan from before they existed, read as its jobs read it then).
    max_line_bytes: int | None = None
    max_id_bytes: int | None = None
    # The fan-out's arms (storage.fan_out): each kept record is read once per arm.
    fan_out: tuple[str, ...] | None = None

    def as_params(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        if self.fan_out is None:  # none: the params (job ids, fingerprints) as before fan-outs
            del out["fan_out"]
        else:
            out["fan_out"] = list(self.fan_out)
        return out

    @property
    def fanned(self) -> FanOut | None:
        """The range's fan-out (``None``: none)."""
        return None if self.fan_out is None else FanOut(self.fan_out)

    @classmethod
    def from_params(cls, value: Any) -> InputRange:
        try:
            rng = cls(**value)
            check_on_error(rng.on_error)
            arms = FanOut.of(rng.fan_out, "params.input_range.fan_out")
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"params.input_range is not a range shard's description ({exc})") from None
        if arms is not None:
            rng = dataclasses.replace(rng, fan_out=arms.arms)
        if not (isinstance(rng.start, int) and isinstance(rng.end, int) and 0 <= rng.start < rng.end):
            raise ConfigError(f"params.input_range [{rng.start}, {rng.end}) is not a byte range")
        for name in ("max_line_bytes", "max_id_bytes"):
            bound = getattr(rng, name)
            if bound is not None and (type(bound) is not int or bound < 1):
                raise ConfigError(f"params.input_range.{name} must be a whole number >= 1, got {bound!r}")
        return rng


def range_params(shard: ShardDescriptor, *, id_field: str | None, assign_ids: bool) -> dict[str, Any]:
    """A job's ``params`` for reading ``shard``: ``input_range`` for a range shard, else nothing."""
    if "range" not in shard:
        return {}
    return {"input_range": _input_range(shard, id_field, assign_ids).as_params()}


def _input_range(shard: Mapping[str, Any], id_field: str | None, assign_ids: bool) -> InputRange:
    start, end = shard["range"]
    return InputRange(
        shard["shard_id"],
        start,
        end,
        shard.get("version", ""),
        id_field,
        assign_ids,
        lead_in=shard.get("lead_in"),
        max_line_bytes=shard.get("max_line_bytes"),
        max_id_bytes=shard.get("max_id_bytes"),
        fan_out=tuple(shard["fan_out"]) if shard.get("fan_out") else None,
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
        super().__init__(file.uri, self.file.iter_lines, on_error=rng.on_error, rejects=rejects)
        self.range = rng
        assign = assigned_id(file.loc.name, rng, file.compressed) if rng.assign_ids else None
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

    def line_of(self, value: Any) -> int:
        """The line in the range of the kept record with id ``value`` (read already): the validator
        keeps every id of a range with its line (``window=None``) to find repeats."""
        return self.check._seen[value]

    def check_version(self) -> None:
        now = source_version(self.file.info())
        if self.range.version and now != self.range.version:
            raise StorageError(
                f"shard {self.range.shard_id}: {self.file.uri} changed since the run was sharded "
                f"(planned for version {self.range.version}, now {now}), so its byte range "
                f"[{self.range.start}, {self.range.end}) may no longer start at a line. Remedy: restore "
                "the file, or start a new run (another run root) over the new file."
            )

    def __iter__(self) -> Generator[Record, None, None]:
        ok = False
        try:
            self.check_version()
            chunks = range_chunks(self.file, self.range)
            for block in iter_line_blocks(chunks, strip_cr=False, max_line=self.range.max_line_bytes):
                _, ids, records = self.check.check_block(block)
                if self._keep is not None:  # e.g. the job's id hash file (storage.id_hashes)
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


class DiscardRejects:
    """A rejects sink that keeps nothing: for reads of a range after its job (and round 0's close)
    quarantined its bad lines (the pre-flight sample, the accounting's read of a range's ids)."""

    def write(self, record: Record) -> None:
        pass


def range_ids(
    shard: Mapping[str, Any],
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
    shard: Mapping[str, Any],
    *,
    id_field: str | None,
    assign_ids: bool,
    rejects: RecordSink | None,
    storage_options: StorageOptions | None = None,
    expand: bool = True,
) -> RangeRecordReader:
    """A validating reader over one range shard's descriptor (the round's close reads a range whose
    job never completed with it, to account for its ids, lines and rejects). ``expand``: yield a
    fan-out's rows (else its lines' records)."""
    rng = _input_range(shard, id_field, assign_ids)
    file = JsonlFile(shard["uri"], storage_options=storage_options)
    return RangeRecordReader(file, rng, rejects=rejects, expand=expand)
