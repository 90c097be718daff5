"""Round-0 range shards: planning covers the file exactly once at line (or frame) starts, reading a
range validates it as sharding does, and unsplittable input falls back to copying."""

from __future__ import annotations

import random
from pathlib import Path

import orjson
import pytest

from airflow_batchinfer.storage.range_plan import line_ranges, plan_ranges
from airflow_batchinfer.storage.ranges import read_range
from tests.support.frames import Sink, frames_file, read_all


@pytest.mark.parametrize("seed", range(25))
def test_line_ranges_cover_the_file_once_at_line_starts(tmp_path: Path, seed: int) -> None:
    rnd = random.Random(seed)
    lines = [b"x" * rnd.choice([0, 1, 5, 80, 3000, 70_000]) for _ in range(rnd.randint(0, 60))]
    eol = b"\r\n" if seed % 3 == 0 else b"\n"
    data = eol.join(lines) + (eol if seed % 2 else b"")
    path = tmp_path / "f.jsonl"
    path.write_bytes(data)
    with open(path, "rb") as raw:
        ranges = line_ranges(raw, len(data), rnd.choice([1, 7, 100, 5000, 100_000]))
    assert b"".join(data[a:b] for a, b in ranges) == data  # contiguous, exact, never empty
    assert all(b > a for a, b in ranges)
    assert all(a == 0 or data[a - 1 : a] == b"\n" for a, _ in ranges)


def test_empty_file_has_no_shards(tmp_path: Path) -> None:
    (tmp_path / "e.jsonl").write_bytes(b"")
    plan = plan_ranges(str(tmp_path / "e.jsonl"), records_per_shard=10, max_bytes_per_shard=1 << 20)
    assert plan is not None and plan.shards == []


def test_plain_ranges_read_every_record_once_without_a_trailing_newline(tmp_path: Path) -> None:
    rows = [orjson.dumps({"id": i, "x": "y" * (i % 97)}) for i in range(2000)]
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"\r\n".join(rows))  # CRLF, no newline at the end
    ids, rejects, shards = read_all(str(path), 150)
    assert ids == list(range(2000)) and not rejects and 8 <= len(shards) <= 20
    assert all(s.ids is None and s.estimated and s.bytes == s.span for s in shards)


@pytest.mark.parametrize("cut", ["lines", "anywhere"])
def test_multi_frame_zstd_is_sharded_by_frames(tmp_path: Path, cut: str) -> None:
    data = b"".join(orjson.dumps({"id": i, "x": "z" * (i % 50)}) + b"\n" for i in range(5000))
    ends = [i + 1 for i, c in enumerate(data) if c == 10]
    cuts = ends[250:-1:250] if cut == "lines" else list(range(7001, len(data), 9973))
    path = tmp_path / "d.jsonl.zst"
    frames_file(path, data, cuts)
    ids, rejects, shards = read_all(str(path), 1000)
    assert ids == list(range(5000)) and not rejects and len(shards) > 2
    assert all(
        b == c
        for (_, b), (c, _) in zip([s.range for s in shards], [s.range for s in shards[1:]], strict=False)
    )


def test_single_frame_zstd_cannot_be_split(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl.zst"
    frames_file(path, b"".join(orjson.dumps({"id": i}) + b"\n" for i in range(100)), [])
    assert plan_ranges(str(path), records_per_shard=10, max_bytes_per_shard=1 << 20) is None


def test_a_range_rejects_bad_lines_and_repeated_ids_with_their_place(tmp_path: Path) -> None:
    lines = [orjson.dumps({"id": i}) for i in range(40)]
    lines[3] = b"{not json"
    lines[25] = b"[1, 2]"
    lines[30] = orjson.dumps({"id": 29})  # repeats line 30's id (0-based 29)
    lines[12] = b""
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    ids, rejects, shards = read_all(str(path), 10)
    assert len(ids) == 36 and 29 in ids and 30 not in ids
    by_offset = {r["offset"] + next(s.range[0] for s in shards if s.range[0] <= 0): r for r in rejects}
    assert len(rejects) == 3 and all("line_in_range" in r for r in rejects)
    assert any("duplicate id 29" in r["error"] for r in rejects) and by_offset


def test_a_changed_source_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"".join(orjson.dumps({"id": i}) + b"\n" for i in range(50)))
    plan = plan_ranges(str(path), records_per_shard=10, max_bytes_per_shard=1 << 20)
    assert plan is not None
    path.write_bytes(b"".join(orjson.dumps({"id": i}) + b"\n" for i in range(60)))
    from airflow_batchinfer.exceptions import StorageError

    with pytest.raises(StorageError, match="changed since the run was sharded"):
        list(read_range(plan.shards[1], id_field="id", assign_ids=False, rejects=Sink()))
