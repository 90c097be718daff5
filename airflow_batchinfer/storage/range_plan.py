"""Planning round-0 shards as byte ranges of the input file (the run's first task): it stats the
source and reads O(shards) small pieces of it, never copies it.

- plain JSONL: boundaries about ``records_per_shard`` records apart (bytes per record estimated
  from the first :data:`SAMPLE` bytes), each moved to the next line start by a ranged read;
- multi-frame zstd: whole frames (:mod:`~airflow_batchinfer.storage.zstd_frames`) grouped into
  shards;
- a single-frame zstd file cannot be split: :func:`plan_ranges` returns ``None`` and the caller
  copies it into shards (:func:`~airflow_batchinfer.storage.sharding.shard_dataset`).

:func:`shard_ranges` records the plan in the input's manifest; reading a range is
:mod:`~airflow_batchinfer.storage.ranges`'."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any, BinaryIO

from airflow_batchinfer.exceptions import ConfigError, OutputExistsError
from airflow_batchinfer.storage import taper
from airflow_batchinfer.storage.fan_out import FanOut
from airflow_batchinfer.storage.file_version import keep_recorded, source_version
from airflow_batchinfer.storage.input_parts import InputParts, list_input
from airflow_batchinfer.storage.jsonl_dir import JsonlDir
from airflow_batchinfer.storage.jsonl_file import JsonlFile
from airflow_batchinfer.storage.lines import MAX_LINE_BYTES, BadLine
from airflow_batchinfer.storage.location import StorageOptions, join, parent
from airflow_batchinfer.storage.manifest import OutputManifest, claim_output, read_manifest, write_manifest
from airflow_batchinfer.storage.part_plan import plan_parts
from airflow_batchinfer.storage.pieces import parquet_part_rows
from airflow_batchinfer.storage.plan_probe import (
    PLAN_BLOCK,
    SAMPLE,
    Counting,
    RangePlan,
    next_line_start,
    sample_rate,
    zstd_sample,
)
from airflow_batchinfer.storage.records import (
    MAX_ID_BYTES,
    OnError,
    RecordError,
    parse_record,
)
from airflow_batchinfer.storage.shard_ref import RangeRef
from airflow_batchinfer.storage.sharding import bounds_fingerprint
from airflow_batchinfer.storage.validate import detect_id_field
from airflow_batchinfer.storage.zstd_frames import Frame, zstd_frames


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
        raw: Any = Counting(opened)  # a BinaryIO to what planning calls
        if f.compressed:
            frames = zstd_frames(raw, size, f.uri) if size else []
            if len(frames) < 2:
                return None
            per_record, ratio = zstd_sample(raw, frames[0], f.uri)
            ranges, estimates, lead_ins = _group_frames(
                frames, per_record, ratio, records_per_shard, max_bytes_per_shard, lanes, min_records
            )
        else:
            raw.seek(0)
            head = raw.read(min(size, SAMPLE))
            per_record = sample_rate(head)
            target = max(1, min(max_bytes_per_shard, round(records_per_shard * per_record)))
            # the floor in the target's bytes: decided in records, so a shard at the floor keeps its size
            floor = target * taper.finest(records_per_shard, min_records) / records_per_shard
            ranges = line_ranges(raw, size, target, lanes, floor)
            estimates = [max(1, round((b - a) / per_record)) for a, b in ranges]
            lead_ins = [None] * len(ranges)
    shards = []
    for i, ((a, b), n, lead_in) in enumerate(zip(ranges, estimates, lead_ins, strict=True)):
        shards.append(
            RangeRef(
                shard_id=f"part-{i:05d}",
                uri=f.uri,
                records=n,
                range=(a, b),
                bytes=b - a,
                version=version,
                estimated=True,
                lead_in=(lead_in[0], lead_in[1]) if lead_in is not None else None,
            )
        )
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
    listed: InputParts | None = None,
) -> tuple[list[RangeRef], OutputManifest, bool] | None:
    """Plan ``src`` as range shards and record the plan in ``dst``'s manifest (``kind: ranges``),
    claiming ``dst`` and ``rejects`` as :func:`~airflow_batchinfer.storage.sharding.shard_dataset`
    does. Returns ``(shards, manifest, reused)``, or ``None`` when ``src`` cannot be split. Each
    shard carries ``max_line_bytes`` and ``max_id_bytes``, so every reader of a range (its job, the
    close, the pre-flight) validates it with the same bounds. With ``fan_out`` each shard names its
    arms too, holds about ``records_per_shard / arms`` lines, and its ``records`` count its rows (the
    manifest's ``counts`` stay the input's: its lines' records). ``lanes``: the round's lanes, for
    which the last ranges taper (:mod:`~airflow_batchinfer.storage.taper`; recorded as the
    manifest's ``taper_lanes``, not in its fingerprint: a complete plan is reused whatever the
    lanes). ``listed``: ``src`` as the caller listed it already (its owner check), not listed again."""
    out = JsonlDir(dst, storage_options=storage_options)
    rejects_dir = JsonlDir(rejects or join(parent(out.uri), "rejects"), storage_options=storage_options)
    inp = listed if listed is not None else list_input(src, storage_options)
    first = next((p for p in inp.parts if p.size), inp.parts[0])
    source = JsonlFile(first.uri, storage_options=storage_options, max_line_bytes=max_line_bytes)
    fingerprint = {
        "source": inp.uri,
        "version": inp.version,
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
    if earlier is not None and _detected_before(earlier, id_field):
        fingerprint["id_field"] = None  # the field the earlier plan detected, now named: the same plan
    if earlier is not None:  # a plan from before local versions carried inode and ctime
        fingerprint = keep_recorded(fingerprint, earlier.fingerprint)
    if earlier is not None and earlier.kind == "shard" and not overwrite:
        return None  # copied shards (unsplittable input): sharding reuses or refuses them itself
    if earlier is not None and not overwrite:
        _refuse_a_changed_plan(out.uri, inp.uri, earlier, fingerprint)
    done = claim_output(out, kind="ranges", fingerprint=fingerprint, overwrite=overwrite)
    if done is not None:
        return [s for s in done.shards if isinstance(s, RangeRef)], done, True
    arms = len(fan_out.arms) if fan_out is not None else 1
    how: dict[str, Any] = {
        "records_per_shard": -(-records_per_shard // arms),  # lines: each is ``arms`` rows
        "max_bytes_per_shard": max_bytes_per_shard,
        "storage_options": storage_options,
        "lanes": lanes,
        "min_records": taper.MIN_RECORDS / arms,  # lines: the floor counts rows
    }
    # one file as it always was (its refs, manifest and fingerprint unchanged), else its parts
    plan = plan_ranges(src, **how) if inp.single else plan_parts(inp, **how)
    if plan is not None and not plan.shards and not inp.single:  # empty parts, or no rows
        raise ConfigError(
            f"input {inp.uri} holds no records ({len(inp.parts)} part(s), all empty or without rows). "
            "Remedy: check the path, or give the input that holds the data"
        )
    if plan is None:
        write_manifest(out, OutputManifest(kind="ranges", state="unsplittable", fingerprint=fingerprint))
        return None
    claim_output(rejects_dir, kind="shard-rejects", fingerprint=fingerprint, overwrite=overwrite, reuse=False)
    if id_field is None:  # as sharding does: from the first record (custom_id for OpenAI batch input)
        id_field = _first_id_field(_first_lines(inp, source))
    estimated = sum(s.records for s in plan.shards)
    shards = _bound_shards(plan.shards, max_line_bytes, max_id_bytes, fan_out)
    manifest = _complete_manifest(plan, shards, fingerprint, estimated, id_field, rejects_dir.uri, lanes)
    write_manifest(out, manifest)
    return shards, manifest, False


def _detected_before(earlier: OutputManifest, id_field: str | None) -> bool:
    """Whether the earlier plan detected the id field that ``id_field`` now names."""
    detected = (earlier.fingerprint or {}).get("id_field") is None
    return detected and id_field is not None and id_field == earlier.id_field


def _bound_shards(
    shards: list[RangeRef], max_line_bytes: int, max_id_bytes: int, fan_out: FanOut | None
) -> list[RangeRef]:
    """Each range with its readers' line and id bounds and, with ``fan_out``, its arms (its
    ``records`` then count rows)."""
    bounds: dict[str, Any] = {"max_line_bytes": max_line_bytes, "max_id_bytes": max_id_bytes}
    if fan_out is None:
        return [s.model_copy(update=bounds) for s in shards]
    arms = tuple(fan_out.arms)
    return [
        s.model_copy(update={**bounds, "records": s.records * len(arms), "fan_out": arms}) for s in shards
    ]


def _complete_manifest(
    plan: RangePlan,
    shards: list[RangeRef],
    fingerprint: dict[str, Any],
    estimated: int,
    id_field: str | None,
    rejects_uri: str,
    lanes: int,
) -> OutputManifest:
    """The manifest of a complete range plan: its shards, estimated counts and how it was planned."""
    return OutputManifest(
        kind="ranges",
        state="complete",
        fingerprint=fingerprint,
        shards=list(shards),
        # Known once round 0's close has read every range (it fills these in, and each shard's ids).
        counts={"records": estimated, "estimated": 1},
        id_field=id_field,
        rejects_uri=rejects_uri,
        planning={"bytes_read": plan.bytes_read, "seconds": round(plan.seconds, 3)},
        taper_lanes=lanes,
    )


def _refuse_a_changed_plan(
    uri: str, source: str, earlier: OutputManifest, fingerprint: dict[str, Any]
) -> None:
    """Refuse to plan again over a complete range plan made with another fingerprint: its rounds read
    ranges of the file as it was, and a new plan over a changed file would mix them."""
    if earlier.kind != "ranges" or not earlier.complete or earlier.fingerprint == fingerprint:
        return
    was = earlier.fingerprint or {}
    raise OutputExistsError(
        f"{uri} holds the range plan of {was.get('source')} (version {was.get('version')}), but the "
        f"input is now {source} (version {fingerprint['version']}) or other sharding settings: the "
        "run's rounds read the file as it was (a part input's version covers its part list: a part "
        "added, removed or rewritten changes it). Remedy: restore the file (an object store's same "
        "bytes; a local file's inode and ctime count too, which no copy restores; a part input: its "
        "parts as they were), or start a new run (another run_name) over the new one."
    )


def _first_lines(inp: InputParts, source: JsonlFile) -> Iterator[bytes]:
    """The input's first lines (a Parquet input's first rows as JSON lines, from its first parts with
    rows: a part may hold row groups, or a footer, without any), read no further than they are taken."""
    if inp.format != "parquet":
        yield from (line for _, line in source.iter_lines())
        return
    for part in inp.parts:
        if part.size == 0:
            continue
        for block in parquet_part_rows(JsonlFile(source.loc.at(part.uri)), part.size, batch_rows=64):
            yield from block.lines()


def _first_id_field(lines: Iterator[bytes]) -> str:
    """:func:`detect_id_field` of the first record among the first lines (a short read)."""
    for line in itertools.islice(lines, 1000):
        if isinstance(line, BadLine):  # its first bytes are not the record
            continue
        try:
            return detect_id_field(parse_record(line))
        except RecordError:
            continue
    return "id"
