"""Issue 37, item 10: a same-size rewrite of a local input whose mtime is set back (``cp -p``,
``rsync -t``, ``touch -r``) kept the input's version (size and mtime), so a resumed run reused the
shards or the range plan of the old bytes, and range jobs read the new bytes at the old plan's
offsets. A local file's version now carries its inode and ctime, which no rewrite keeps; versions
recorded before it did still match."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from airflow_batchinfer.exceptions import OutputExistsError, StorageError
from airflow_batchinfer.storage.file_version import LOCAL_MARK, keep_recorded, same_version
from airflow_batchinfer.storage.range_plan import shard_ranges
from airflow_batchinfer.storage.ranges import read_range
from airflow_batchinfer.storage.sharding import shard_dataset
from tests.support.frames import Sink

pytestmark = pytest.mark.security


def lines(word: str) -> bytes:
    return b"".join(orjson.dumps({"id": i, "q": word}) + b"\n" for i in range(50))


def rewrite_keeping_mtime(path: Path, data: bytes) -> None:
    """The same size, other bytes, the mtime set back to what it was (as ``cp -p`` leaves it)."""
    before = path.stat()
    assert len(data) == before.st_size
    path.write_bytes(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def test_sharding_does_not_reuse_shards_of_a_same_size_rewrite(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_bytes(lines("old"))
    first = shard_dataset(str(src), str(tmp_path / "run" / "input"), records_per_shard=20)
    assert not first.reused
    rewrite_keeping_mtime(src, lines("new"))
    with pytest.raises(OutputExistsError, match="other inputs or settings"):  # before: reused the old shards
        shard_dataset(str(src), str(tmp_path / "run" / "input"), records_per_shard=20)


def test_a_range_plan_of_a_same_size_rewrite_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_bytes(lines("old"))
    args = {"records_per_shard": 20, "max_bytes_per_shard": 1 << 20, "id_field": "id", "assign_ids": False}
    planned = shard_ranges(str(src), str(tmp_path / "run" / "input"), **args)
    assert planned is not None
    shards, _, _ = planned
    rewrite_keeping_mtime(src, lines("new"))
    with pytest.raises(StorageError, match="changed since the run was sharded"):  # the range's job
        list(read_range(shards[0], id_field="id", assign_ids=False, rejects=Sink()))
    with pytest.raises(OutputExistsError, match="holds the range plan of"):  # a resumed run's plan
        shard_ranges(str(src), str(tmp_path / "run" / "input"), **args)


def test_versions_recorded_before_local_identities_still_match() -> None:
    now = f"120:1700000000.5{LOCAL_MARK}42:1700000001.25"
    assert same_version("120:1700000000.5", now)  # a plan from before: the same size and mtime
    assert not same_version("120:1700000000.7", now)
    assert not same_version(f"120:1700000000.5{LOCAL_MARK}41:1700000001.25", now)
    assert keep_recorded({"version": "1700000000.5@42:1"}, {"version": "1700000000.5"}) == {
        "version": "1700000000.5"
    }
    assert keep_recorded({"version": "1700000000.5@42:1"}, {"version": "1700000000.6"})["version"].endswith(
        ":1"
    )
