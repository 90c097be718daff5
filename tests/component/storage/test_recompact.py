from __future__ import annotations

from typing import Any

import pytest

from airflow_batchinfer.exceptions import OutputExistsError, StorageError
from airflow_batchinfer.storage import JsonlDir
from airflow_batchinfer.storage.recompact import recompact
from tests.support.roots import Root


def small_shards(root: Root, sizes: list[int], name: str = "rejected") -> JsonlDir:
    """One shard per size, ids numbered globally so order can be checked."""
    d = JsonlDir(root.uri(name), storage_options=root.storage_options)
    nxt = 0
    for i, n in enumerate(sizes):
        with d.file(f"part-{i:05d}.jsonl.zst").writer_sync() as w:
            w.write_many({"id": nxt + k, "v": "x" * (k % 7)} for k in range(n))
        nxt += n
    return d


def run(root: Root, **kw: Any) -> Any:
    return recompact(root.uri("rejected"), root.uri("pending"), storage_options=root.storage_options, **kw)


def pending(root: Root) -> JsonlDir:
    return JsonlDir(root.uri("pending"), storage_options=root.storage_options)


@pytest.mark.parametrize("workers", [1, 3, 8])
def test_small_shards_become_full_shards_in_order(root: Root, workers: int) -> None:
    sizes = [13, 0, 250, 7, 99, 1, 130, 44, 301, 5]
    small_shards(root, sizes)
    result = run(root, records_per_shard=100, workers=workers)
    total = sum(sizes)
    assert result.records == total and result.sources == len(sizes)
    assert [d.records for d in result.shards] == [100] * (total // 100) + [total % 100]
    assert [d.shard_id for d in result.shards] == [f"part-{i:05d}" for i in range(len(result.shards))]
    assert [r["id"] for r in pending(root).iter_records()] == list(range(total))


def test_given_counts_skip_the_count_pass_and_match(root: Root) -> None:
    sizes = [40, 60, 25]
    small_shards(root, sizes)
    counts = {f"part-{i:05d}": n for i, n in enumerate(sizes)}
    result = run(root, records_per_shard=50, counts=counts, workers=2)
    assert [d.records for d in result.shards] == [50, 50, 25]
    assert [r["id"] for r in pending(root).iter_records()] == list(range(125))


def test_wrong_counts_are_detected_not_silently_trusted(root: Root) -> None:
    small_shards(root, [40, 60])
    with pytest.raises(StorageError, match="40 records but 30 were planned"):
        run(root, records_per_shard=50, counts={"part-00000": 30, "part-00001": 60}, workers=1)


def test_byte_limit_splits_into_extra_shards_without_loss(root: Root) -> None:
    small_shards(root, [30, 30])
    result = run(root, records_per_shard=20, max_bytes_per_shard=300, workers=2)
    assert all(d.records <= 20 for d in result.shards)
    assert sorted(r["id"] for r in pending(root).iter_records()) == list(range(60))
    assert sum(d.records for d in result.shards) == 60


def test_empty_source_gives_no_shards(root: Root) -> None:
    result = run(root)
    assert result.shards == [] and result.records == 0
    assert pending(root).shards() == []


def test_rerun_is_reused_and_foreign_output_refused(root: Root) -> None:
    small_shards(root, [10, 10])
    first = run(root, records_per_shard=15)
    again = run(root, records_per_shard=15)
    assert again.reused and again.shards == first.shards
    with pytest.raises(OutputExistsError):
        run(root, records_per_shard=5)
    assert len(run(root, records_per_shard=5, overwrite=True).shards) == 4


def test_progress_counts_records(root: Root) -> None:
    small_shards(root, [10, 20, 30])
    seen: list[int] = []
    run(root, records_per_shard=25, progress=lambda n, b: seen.append(n))
    assert sum(seen) == 60


def test_invalid_arguments(root: Root) -> None:
    with pytest.raises(ValueError, match="workers"):
        run(root, workers=0)
    with pytest.raises(ValueError, match="records_per_shard"):
        run(root, records_per_shard=0)
