from __future__ import annotations

import pytest

from airflow_batchinfer.storage import JsonlDir
from tests.support.roots import Root


def make_dir(root: Root, name: str = "shards") -> JsonlDir:
    return JsonlDir(root.uri(name), storage_options=root.storage_options)


def recs(n: int, start: int = 0, pad: int = 0) -> list[dict[str, object]]:
    return [{"id": i, "p": "x" * pad} for i in range(start, start + n)]


def test_listing_is_numeric_and_ignores_other_files(root: Root) -> None:
    d = make_dir(root)
    fs, path = d.loc.fs, d.loc.path
    fs.makedirs(path, exist_ok=True)
    for name in [
        "part-99999.jsonl.zst",
        "part-100000.jsonl.zst",
        "part-00002.jsonl",
        "PART-00010.JSONL.ZSTD",
        "_manifest.json",
        "notes.txt",
        "part-1.json",
        ".part-00003.jsonl.zst.tmp-" + "a" * 32,
    ]:
        fs.pipe_file(f"{path}/{name}", b"")
    assert [s.name for s in d.shards()] == [
        "part-00002.jsonl",
        "PART-00010.JSONL.ZSTD",
        "part-99999.jsonl.zst",
        "part-100000.jsonl.zst",
    ]
    assert [s.index for s in d.shards()] == [2, 10, 99999, 100000]


def test_missing_directory_lists_empty(root: Root) -> None:
    assert make_dir(root, "does-not-exist").shards() == []


def test_rotation_by_records(root: Root) -> None:
    d = make_dir(root)
    with d.writer_sync(max_records_per_shard=1000) as w:
        w.write_many(recs(2500))
    assert [s.records for s in w.shards_written] == [1000, 1000, 500]
    assert [s.name for s in d.shards()] == [
        "part-00000.jsonl.zst",
        "part-00001.jsonl.zst",
        "part-00002.jsonl.zst",
    ]
    assert [r["id"] for r in d.iter_records()] == list(range(2500))


def test_exact_multiple_leaves_no_empty_shard(root: Root) -> None:
    d = make_dir(root)
    with d.writer_sync(max_records_per_shard=100) as w:
        for r in recs(300):
            w.write(r)
    assert [s.records for s in w.shards_written] == [100, 100, 100]
    assert len(d.shards()) == 3


def test_no_records_no_shard(root: Root) -> None:
    d = make_dir(root)
    with d.writer_sync() as w:
        pass
    assert w.shards_written == []
    assert d.shards() == []


def test_rotation_by_uncompressed_bytes(root: Root) -> None:
    d = make_dir(root)
    rows = recs(10, pad=90)  # each line is a bit over 100 bytes
    line = len(b'{"id":0,"p":"' + b"x" * 90 + b'"}\n')
    with d.writer_sync(max_bytes_per_shard=3 * line + 5, compression="none") as w:
        w.write_many(rows)
    assert [s.records for s in w.shards_written] == [3, 3, 3, 1]
    for shard in d.shards():  # rotated before the record that would overflow
        assert d.loc.fs.size(f"{d.loc.path}/{shard.name}") <= 3 * line + 5


def test_oversized_record_gets_a_shard_of_its_own(root: Root) -> None:
    d = make_dir(root)
    with d.writer_sync(max_bytes_per_shard=200, compression="none") as w:
        w.write({"id": 0})
        w.write({"id": 1, "big": "y" * 1000})
        w.write({"id": 2})
        w.write({"id": 3, "big": "z" * 1000})
        w.write({"id": 4, "big": "z" * 1000})
    assert [s.records for s in w.shards_written] == [1, 1, 1, 1, 1]
    assert [r["id"] for r in d.iter_records()] == [0, 1, 2, 3, 4]


def test_appending_continues_numbering(root: Root) -> None:
    d = make_dir(root)
    with d.writer_sync(max_records_per_shard=10) as w:
        w.write_many(recs(15))
    d.loc.fs.pipe_file(f"{d.loc.path}/part-00041.jsonl.zst", b"")  # a gap: numbering follows the highest
    d.loc.fs.rm(f"{d.loc.path}/part-00041.jsonl.zst")
    d.loc.fs.pipe_file(f"{d.loc.path}/part-00007.jsonl", b'{"id": "x"}\n')
    with d.writer_sync(max_records_per_shard=10) as w2:
        w2.write_many(recs(12, start=100))
    assert [s.shard_id for s in w2.shards_written] == ["part-00008", "part-00009"]


def test_exception_discards_open_shard_keeps_committed(root: Root) -> None:
    d = make_dir(root)
    with pytest.raises(RuntimeError), d.writer_sync(max_records_per_shard=10) as w:
        w.write_many(recs(25))
        raise RuntimeError("mid-write failure")
    assert [s.records for s in w.shards_written] == [10, 10]
    assert [s.name for s in d.shards()] == ["part-00000.jsonl.zst", "part-00001.jsonl.zst"]
    assert d.count_records() == 20
    names = [p.rsplit("/", 1)[-1] for p in d.loc.fs.ls(d.loc.path, detail=False, refresh=True)]
    assert sorted(names) == ["part-00000.jsonl.zst", "part-00001.jsonl.zst"]  # no temp left behind


async def test_async_writer_rotates_and_commits(root: Root) -> None:
    d = make_dir(root)
    async with d.writer(max_records_per_shard=700) as w:
        for r in recs(2000):
            await w.write(r)
    assert [s.records for s in w.sync.shards_written] == [700, 700, 600]
    assert [r["id"] for r in d.iter_records()] == list(range(2000))


def test_delete_shards(root: Root) -> None:
    d = make_dir(root)
    with d.writer_sync(max_records_per_shard=5) as w:
        w.write_many(recs(12))
    assert d.delete_shards() == 3
    assert d.shards() == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_records_per_shard": 0}, "max_records_per_shard"),
        ({"max_bytes_per_shard": 0}, "max_bytes_per_shard"),
        ({"compression": "gzip"}, "compression"),
    ],
)
def test_invalid_writer_settings(tmp_path: object, kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        JsonlDir(f"{tmp_path}/d").writer_sync(**kwargs)  # type: ignore[arg-type]
