"""Issue 38, item 6: part inputs on local disk and on the S3 server (one server for the session):
JSONL, zstd and Parquet parts listed with their versions, planned and read in place, a part replaced
or added after planning refused, a corrupt Parquet footer refusing the plan (the rest in
tests/unit/storage/test_input_parts*.py)."""

from __future__ import annotations

import pytest

from airflow_batchinfer.exceptions import CorruptFileError, OutputExistsError, StorageError
from airflow_batchinfer.storage.input_parts import list_input
from airflow_batchinfer.storage.range_plan import shard_ranges
from airflow_batchinfer.storage.ranges import read_range
from airflow_batchinfer.storage.shard_ref import RangeRef
from tests.support.frames import Sink
from tests.support.parts import parquet_part, part_bytes, put, read_shards, write_parts
from tests.support.roots import Root


def plan(root: Root, src: str, run: str = "run") -> list[RangeRef]:
    planned = shard_ranges(
        src,
        root.uri(run, "input"),
        records_per_shard=300,
        max_bytes_per_shard=1 << 30,
        id_field="id",
        assign_ids=False,
        storage_options=root.storage_options,
    )
    assert planned is not None
    return [s for s in planned[0] if isinstance(s, RangeRef)]


@pytest.mark.parametrize("ext", [".jsonl", ".jsonl.zst"])
def test_a_directory_and_a_glob_of_parts_are_read_in_place(root: Root, ext: str) -> None:
    so = root.storage_options
    total = write_parts(root.uri("in"), [40, 0, 900, 7, 3], ext=ext, frame_lines=50, so=so)
    put(root.uri("in", "_SUCCESS"), b"", so)
    put(root.uri("in", "sub", f"part-0{ext}"), part_bytes(total, 5, zstd=ext.endswith("zst")), so)
    listed = list_input(root.uri("in"), so)
    assert len(listed.parts) == 6 and listed.parts[-1].uri == root.uri("in", "sub", f"part-0{ext}")
    shards = plan(root, root.uri("in"))
    ids, rejects = read_shards(shards, so)  # each piece's listed version is the one its read finds
    assert ids == [f"r{i}" for i in range(total + 5)] and not rejects
    assert len(shards) >= 3 and any(len(s.pieces or ()) > 1 for s in shards)
    globbed = plan(root, root.uri("in", f"part-*{ext}"), "run2")
    assert read_shards(globbed, so)[0] == [f"r{i}" for i in range(total)]


def test_a_part_replaced_or_added_on_the_store_is_refused(root: Root) -> None:
    so = root.storage_options
    write_parts(root.uri("in"), [5, 5], so=so)
    (shard,) = plan(root, root.uri("in"))
    put(root.uri("in", "part-1.jsonl"), part_bytes(50, 5), so)  # the same size, other bytes
    with pytest.raises(StorageError, match=r"part-1\.jsonl of the input changed since"):
        list(read_range(shard, id_field="id", assign_ids=False, rejects=Sink(), storage_options=so))
    put(root.uri("in", "part-2.jsonl"), part_bytes(60, 5), so)
    with pytest.raises(OutputExistsError, match="holds the range plan of"):
        plan(root, root.uri("in"))


def test_parquet_parts_on_the_store_are_read_by_row_groups(root: Root) -> None:
    pytest.importorskip("pyarrow")
    so = root.storage_options
    parquet_part(root.uri("hf", "data", "train-00000-of-00003.parquet"), 0, 500, group=100, so=so)
    parquet_part(root.uri("hf", "data", "train-00001-of-00003.parquet"), 500, 0, so=so)  # no rows
    parquet_part(root.uri("hf", "data", "train-00002-of-00003.parquet"), 500, 40, group=100, so=so)
    shards = plan(root, root.uri("hf", "data", "train-*.parquet"))
    assert read_shards(shards, so)[0] == [f"r{i}" for i in range(540)]
    assert sum(s.records for s in shards) == 540 and all(p.rows for s in shards for p in s.pieces or ())
    put(root.uri("hf", "data", "train-00001-of-00003.parquet"), b"not parquet at all", so)
    with pytest.raises(CorruptFileError, match=r"train-00001-of-00003\.parquet"):
        plan(root, root.uri("hf", "data"), "run2")
