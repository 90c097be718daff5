"""Tapered shard sizes: the end of a plan cut finer for its lanes, the rest as before."""

from __future__ import annotations

import itertools
from pathlib import Path

import orjson
import pytest

from airflow_batchinfer.storage import taper
from airflow_batchinfer.storage.fan_out import FanOut
from airflow_batchinfer.storage.range_plan import plan_ranges, shard_ranges
from airflow_batchinfer.storage.ranges import read_range
from tests.support.frames import Sink, frames_file


@pytest.mark.parametrize(("total", "full", "lanes"), [(1_000_000, 10_000, 10), (100_000, 10_000, 10),
                                                      (123_457, 4_000, 3), (50_000, 20_000, 64)])  # fmt: skip
def test_sizes_cover_the_total_full_first_then_shrinking_to_an_eighth(
    total: int, full: int, lanes: int
) -> None:
    sizes = taper.sizes(total, full, lanes, floor=0)
    assert sum(sizes) == total
    finest = full / taper.FINEST
    assert all(b <= a for a, b in itertools.pairwise(sizes[:-1]))  # never grows (the rest may be any)
    assert all(s >= finest for s in sizes[:-1]) and sizes[-1] >= finest / 2
    full_ones = [i for i, s in enumerate(sizes) if s == full]
    # full shards while more than 2 x lanes of them remain; none in the plan's last 2 x lanes x full
    assert all(total - sum(sizes[:i]) >= 2 * lanes * full for i in full_ones)
    assert sum(s for s in sizes if s < full) <= 2 * lanes * full


def test_the_1m_bench_shape() -> None:
    sizes = taper.sizes(1_000_000, 10_000, 10)
    assert len(sizes) == 141 and sizes[:81] == [10_000] * 81  # the module doc's figures
    assert sizes[81] == 9_500 and min(sizes[:-1]) == 1_250


@pytest.mark.parametrize(("full", "lanes", "floor"), [(10, 3, 1_000), (1_000, 8, 1_000), (5_000, 0, 0)])
def test_no_taper_without_lanes_or_below_the_floor(full: int, lanes: int, floor: int) -> None:
    # shards at or below the floor, or no lanes: records_per_shard each and the rest, as always
    assert taper.sizes(34_567, full, lanes, floor) == [full] * (34_567 // full) + [34_567 % full]


def test_a_small_rest_joins_the_shard_before_it() -> None:
    sizes = taper.sizes(80_100, 8_000, 2, floor=0)
    assert sizes[-1] >= 1_000 / 2 and sum(sizes) == 80_100


def records(n: int) -> bytes:
    return b"".join(orjson.dumps({"id": i, "x": "q" * (i % 40)}) + b"\n" for i in range(n))


def read(shards: list[dict]) -> list[int]:
    return [r["id"] for s in shards for r in read_range(s, id_field="id", assign_ids=False, rejects=Sink())]


def test_a_plain_files_last_ranges_taper_and_still_cover_it_once(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(records(60_000))
    flat = plan_ranges(str(path), records_per_shard=8_000, max_bytes_per_shard=1 << 30)
    tapered = plan_ranges(str(path), records_per_shard=8_000, max_bytes_per_shard=1 << 30, lanes=2)
    assert flat is not None and tapered is not None
    assert len(flat.shards) == 8 and len(tapered.shards) > len(flat.shards)
    sizes = [s.bytes for s in tapered.shards]
    assert sizes[-2] < sizes[0] / 4  # the end cut finer: down to 1,000 records (an eighth)
    assert read(tapered.shards) == list(range(60_000))  # every record once, in order
    assert [s.range[0] for s in tapered.shards[1:]] == [s.range[1] for s in tapered.shards[:-1]]


def test_zstd_frames_taper_too(tmp_path: Path) -> None:
    data = records(40_000)
    ends = [i + 1 for i, c in enumerate(data) if c == 10]
    path = tmp_path / "d.jsonl.zst"
    frames_file(path, data, ends[250:-1:250])  # a frame every 250 records
    flat = plan_ranges(str(path), records_per_shard=4_000, max_bytes_per_shard=1 << 30)
    tapered = plan_ranges(str(path), records_per_shard=4_000, max_bytes_per_shard=1 << 30, lanes=2)
    assert flat is not None and tapered is not None
    assert len(tapered.shards) > len(flat.shards)
    assert min(s.records for s in tapered.shards) < 2_000 <= max(s.records for s in flat.shards[:-1])
    assert read(tapered.shards) == list(range(40_000))


def test_a_plain_file_at_the_floor_is_planned_exactly_as_untapered(tmp_path: Path) -> None:
    # records_per_shard 1,000 is the floor itself: whatever the bytes per record round to, no taper
    for n, pad in ((20_200, 7), (31_003, 13), (12_345, 0)):
        path = tmp_path / f"d{n}.jsonl"
        path.write_bytes(b"".join(orjson.dumps({"id": i, "p": "z" * pad}) + b"\n" for i in range(n)))
        flat = plan_ranges(str(path), records_per_shard=1_000, max_bytes_per_shard=1 << 30)
        tapered = plan_ranges(str(path), records_per_shard=1_000, max_bytes_per_shard=1 << 30, lanes=4)
        assert flat is not None and tapered is not None
        assert [s.range for s in tapered.shards] == [s.range for s in flat.shards]


def test_a_fan_outs_floor_counts_rows_not_lines(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(records(60_000))
    arms = FanOut(("a", "b", "c", "d"))
    planned = shard_ranges(str(path), str(tmp_path / "input"), records_per_shard=4_000,
                           max_bytes_per_shard=1 << 30, id_field="id", assign_ids=False, fan_out=arms,
                           lanes=4)  # fmt: skip
    assert planned is not None
    shards, manifest, _ = planned
    rows = [s.records for s in shards]  # each line once per arm
    assert manifest.taper_lanes == 4 and max(rows) == pytest.approx(4_000, rel=0.05)
    assert min(rows[:-1]) == pytest.approx(1_000, rel=0.05)  # 1,000 rows (250 lines), as sizing plans them
