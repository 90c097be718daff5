"""Id digests (storage/digest.py): the count + multiset hash that close and report check the id
invariant with, and the writers that record them (sharding, recompaction)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import orjson
import pytest

from airflow_batchinfer.storage import JsonlDir, JsonlFile, shard_dataset
from airflow_batchinfer.storage.digest import (
    IdDigest,
    LineIds,
    diff_ids,
    file_digest,
    file_ids,
    id_bytes,
    total,
)
from airflow_batchinfer.storage.recompact import recompact

IDS: list[Any] = [f"q{i}" for i in range(500)] + list(range(500))


def test_parts_add_up_to_the_whole_in_any_order() -> None:
    whole = IdDigest.of(IDS)
    shuffled = IDS[:]
    random.Random(1).shuffle(shuffled)
    assert IdDigest.of(shuffled) == whole and whole.count == 1000
    parts = [IdDigest.of(shuffled[i : i + 97]) for i in range(0, 1000, 97)]
    assert sum(parts, IdDigest()) == whole == total(parts)
    assert whole - parts[0] == sum(parts[1:], IdDigest())
    acc = IdDigest()
    for i in IDS[:10]:
        acc.add(i)
    assert acc == IdDigest.of(IDS[:10])


@pytest.mark.parametrize(
    "change",
    [
        lambda ids: ids[1:],  # one lost
        lambda ids: [*ids, ids[3]],  # one doubled
        lambda ids: [*ids[:-1], ids[0]],  # one lost and another doubled: the count stays
        lambda ids: [*ids[:-1], "q-other"],  # one replaced by a stranger
        lambda ids: [*ids, ids[5], ids[5]],  # doubled twice (a XOR would cancel out)
    ],
)
def test_losing_doubling_or_swapping_an_id_changes_the_digest(change: Any) -> None:
    assert IdDigest.of(change(IDS)) != IdDigest.of(IDS)


def test_strings_and_integers_are_different_ids() -> None:
    assert IdDigest.of(["7"]) != IdDigest.of([7])
    assert id_bytes("7") == b'"7"' and id_bytes(7) == b"7" and id_bytes(2**70) == str(2**70).encode()
    assert IdDigest.of([2**70, 1]) == IdDigest.of([1]) + IdDigest.of([2**70])  # beyond orjson's ints


def test_json_round_trip_and_validation() -> None:
    d = IdDigest.of(IDS)
    doc = json.loads(json.dumps(d.to_dict()))
    assert set(doc) == {"count", "sum"} and len(doc["sum"]) == 32
    assert IdDigest.from_dict(doc) == d
    assert IdDigest().to_dict() == {"count": 0, "sum": "0" * 32}
    with pytest.raises(ValueError, match="not an id digest"):
        IdDigest.from_dict({"count": 1, "sum": "abc"})
    assert IdDigest.maybe(None) is None and IdDigest.maybe({"count": "x"}) is None
    assert total([d, None]) is None


@pytest.mark.parametrize(
    "value", ["q1", "", "é ü 日本", 'a"b', "back\\slash", "tab\tx", "\u2028", 0, 7, -12, 2**63, 10**18, None]
)
def test_ids_read_from_lines_are_the_canonical_bytes(value: Any) -> None:
    line_ids = LineIds("id")  # (integers beyond 64 bits parse as floats: sharding never accepts them)
    for row in ({"id": value, "x": 1}, {"x": 1, "id": value}, {"id": value}):
        line = orjson.dumps(row)
        assert line_ids(line) == id_bytes(value), line
        assert line_ids(json.dumps(row, ensure_ascii=True).encode()) == id_bytes(value)  # other writers
    assert LineIds("custom_id")(b'{"custom_id":"c1","body":{"id":"x"}}') == b'"c1"'
    assert LineIds("id")(b'{"id": "spaced", "x": 1}') == b'"spaced"'  # not compact: parsed


def test_diff_names_lost_doubled_and_unexpected_ids() -> None:
    expected = [f"q{i}" for i in range(10_000)]
    actual = [i for i in expected if i not in {"q17", "q4242"}] + ["q99", "q99", "zz"]
    diff = diff_ids(lambda: iter(expected), lambda: iter(actual))
    assert (diff.lost, diff.doubled, diff.unexpected) == (["q17", "q4242"], ["q99", "zz"][:1], ["zz"])
    assert not diff.ok and diff.expected == IdDigest.of(expected) and diff.actual == IdDigest.of(actual)
    same = diff_ids(lambda: iter(expected), lambda: reversed(expected))
    assert same.ok and same.lost == same.doubled == same.unexpected == []


def test_diff_reads_only_the_buckets_that_disagree() -> None:
    """The second pass holds only ids of disagreeing buckets: memory does not grow with the sides."""
    expected = list(range(50_000))
    held: list[int] = []

    def side(ids: list[int]) -> Any:
        def stream() -> Any:
            held.append(0)
            return iter(ids)

        return stream

    diff = diff_ids(side(expected), side(expected[:-1]), bits=12)
    assert diff.lost == [49_999] and len(held) == 4  # two passes per side
    assert diff_ids(side(expected), side(expected)).ok and len(held) == 6  # equal: one pass each


def test_files_digest_and_stream_their_ids(tmp_path: Path) -> None:
    f = JsonlFile(str(tmp_path / "a.jsonl.zst"))
    with f.writer_sync() as w:
        w.write_many({"id": i, "v": "x"} for i in IDS)
    assert file_digest(f, "id") == IdDigest.of(IDS)
    assert list(file_ids([f], "id")) == IDS
    missing = JsonlFile(str(tmp_path / "none.jsonl"))
    assert file_digest(missing, "id") == IdDigest() and list(file_ids([missing, f], "id")) == IDS


def test_digest_speed_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    import time

    ids = [f"doc-{i:09d}" for i in range(200_000)]
    t0 = time.perf_counter()
    IdDigest.of(ids)
    rate = len(ids) / (time.perf_counter() - t0)
    with capsys.disabled():
        print(f"\nIdDigest: {rate / 1e6:.2f} M ids/s")
    assert rate > 0


# ------------------------------------------------------------------------------------ producers
def test_sharding_digests_each_shard_whatever_rotates_it(tmp_path: Path) -> None:
    rows = [{"id": f"r{i}", "q": "x" * (3000 if i % 37 == 0 else 10)} for i in range(1000)]
    rows.insert(5, {"no": "id"})  # rejected: counted by line, no id to digest
    src = tmp_path / "data.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = shard_dataset(str(src), str(tmp_path / "input"), records_per_shard=100, max_bytes_per_shard=8000)
    assert result.counts["quarantined"] == 1 and len(result.shards) > 10  # the byte limit rotates too
    for d in result.shards:
        assert d.ids == file_digest(JsonlFile(d.uri), "id")
        assert d.ids is not None and d.ids.count == d.records
    whole = total(d.ids for d in result.shards)
    assert whole == IdDigest.of(f"r{i}" for i in range(1000))
    again = shard_dataset(str(src), str(tmp_path / "input"), records_per_shard=100, max_bytes_per_shard=8000)
    assert again.reused and again.shards == result.shards  # the manifest keeps them


def test_recompaction_digests_its_output_shards(tmp_path: Path) -> None:
    src = JsonlDir(str(tmp_path / "rejected"))
    ids: list[Any] = []
    for i, n in enumerate([7, 0, 33, 12, 50]):
        with src.file(f"part-{i:05d}.jsonl.zst").writer_sync() as w:
            batch = [f"s{i}-{k}" if k % 3 else i * 100 + k for k in range(n)]
            w.write_many({"id": x, "status": "rejected", "v": 'é"' * k} for k, x in enumerate(batch))
            ids += batch
    result = recompact(src.uri, str(tmp_path / "pending"), records_per_shard=20, workers=3, id_field="id")
    assert result.ids == IdDigest.of(ids).to_dict()
    for d in result.shards:
        assert d.ids == file_digest(JsonlFile(d.uri), "id")
    again = recompact(src.uri, str(tmp_path / "pending"), records_per_shard=20, workers=3, id_field="id")
    assert again.reused and again.ids == result.ids and again.shards == result.shards
    plain = recompact(src.uri, str(tmp_path / "plain"), records_per_shard=20)
    assert plain.ids is None and all("ids" not in d for d in plain.shards)  # without id_field: as before
    # an output recompacted before digests existed is reused as it is (close then reads its ids)
    reused = recompact(src.uri, str(tmp_path / "plain"), records_per_shard=20, id_field="id")
    assert reused.reused and reused.ids is None
