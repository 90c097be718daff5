from __future__ import annotations

import json
from typing import Any

import pytest
import zstandard

from airflow_batchinfer.exceptions import MalformedRecordError, OutputExistsError
from airflow_batchinfer.storage import JsonlDir, JsonlFile, shard_dataset
from airflow_batchinfer.storage.digest import IdDigest
from airflow_batchinfer.storage.manifest import OUTPUT_MANIFEST_VERSION, read_manifest
from tests.support.roots import Root


def put(root: Root, name: str, data: bytes) -> str:
    uri = root.uri(name)
    f = JsonlFile(uri, storage_options=root.storage_options)
    f.loc.fs.makedirs(root.base, exist_ok=True)
    f.loc.fs.pipe_file(f.loc.path, data)
    return uri


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def shard(root: Root, src: str, **kw: Any) -> Any:
    return shard_dataset(src, root.uri("run", "input"), storage_options=root.storage_options, **kw)


def ids_in(root: Root, sub: str) -> list[Any]:
    return [
        r.get("id", r.get("custom_id"))
        for r in JsonlDir(root.uri(*sub.split("/")), storage_options=root.storage_options).iter_records()
    ]


def test_shards_a_file_into_full_shards_and_returns_descriptors(root: Root) -> None:
    src = put(root, "data.jsonl", jsonl([{"id": f"r{i}", "q": i} for i in range(2500)]))
    result = shard(root, src, records_per_shard=1000)
    assert [(d.shard_id, d.records) for d in result.shards] == [
        ("part-00000", 1000),
        ("part-00001", 1000),
        ("part-00002", 500),
    ]
    # references and the digest of their ids, never records
    assert all(set(d.to_json()) == {"shard_id", "uri", "records", "ids"} for d in result.shards)
    for i, d in enumerate(result.shards):
        assert d.ids == IdDigest.of(f"r{j}" for j in range(i * 1000, min(2500, (i + 1) * 1000)))
    assert result.shards[0].uri.endswith("/run/input/part-00000.jsonl.zst")
    assert ids_in(root, "run/input") == [f"r{i}" for i in range(2500)]
    assert result.counts == {"lines": 2500, "records": 2500, "blank": 0, "skipped": 0, "quarantined": 0}


def test_zst_input(root: Root) -> None:
    data = zstandard.ZstdCompressor().compress(jsonl([{"id": i} for i in range(300)]))
    result = shard(root, put(root, "data.JSONL.ZST", data), records_per_shard=100)
    assert len(result.shards) == 3
    assert ids_in(root, "run/input") == list(range(300))


def test_lines_pass_through_byte_for_byte(root: Root) -> None:
    raw = b'{"id": 1, "x": 1.10, "y": "\\u00e9"}\n'
    shard(root, put(root, "d.jsonl", raw), compression="none")
    d = JsonlDir(root.uri("run", "input"), storage_options=root.storage_options)
    assert d.loc.fs.cat_file(f"{d.loc.path}/part-00000.jsonl") == raw


EDGE = (
    b'{"id": "a"}\r\n'  # 1 CRLF: fine
    b"\n"  # 2 blank
    b'{"id": "b", "t": "\xff"}\n'  # 3 non-UTF-8
    b"42\n"  # 4 non-object
    b'{"no_id": 1}\n'  # 5 missing id
    b'{"id": "a"}\n'  # 6 duplicate of line 1
    b'{"id": {"x": 1}}\n'  # 7 unusable id
    b"{oops\n"  # 8 invalid JSON
    b'{"id": "c"}'  # 9 last line without newline
)


def test_quarantine_is_the_default_and_accounts_for_every_line(root: Root) -> None:
    result = shard(root, put(root, "edge.jsonl", EDGE))
    assert ids_in(root, "run/input") == ["a", "c"]
    assert result.counts == {"lines": 9, "records": 2, "blank": 1, "skipped": 0, "quarantined": 6}
    rejects = list(JsonlDir(result.rejects_uri, storage_options=root.storage_options).iter_records())
    assert result.rejects_uri == root.uri("run", "rejects")
    assert [r["line_no"] for r in rejects] == [3, 4, 5, 6, 7, 8]
    errors = [r["error"] for r in rejects]
    assert "UTF-8" in errors[0]
    assert "JSON object" in errors[1]
    assert "missing id field 'id'" in errors[2]
    assert "duplicate id 'a' (first at line 1)" in errors[3]
    assert "non-empty string or an integer" in errors[4]
    assert "invalid JSON" in errors[5]
    assert all(set(r) >= {"source", "line_no", "error", "raw"} for r in rejects)
    assert rejects[0]["raw_base64"]  # non-UTF-8 bytes kept losslessly


def test_on_error_raise_names_file_and_line(root: Root) -> None:
    with pytest.raises(MalformedRecordError, match=r"edge\.jsonl, line 3: not valid UTF-8"):
        shard(root, put(root, "edge.jsonl", EDGE), on_error="raise")
    assert JsonlDir(root.uri("run", "input"), storage_options=root.storage_options).shards() == []


def test_on_error_skip_counts(root: Root) -> None:
    result = shard(root, put(root, "edge.jsonl", EDGE), on_error="skip")
    assert result.counts["skipped"] == 6
    assert JsonlDir(result.rejects_uri, storage_options=root.storage_options).shards() == []


def test_duplicates_detected_within_a_shard_even_across_windows(root: Root) -> None:
    rows = [{"id": i} for i in range(10)] + [{"id": 9}] + [{"id": i} for i in range(10, 15)] + [{"id": 12}]
    result = shard(root, put(root, "dups.jsonl", jsonl(rows)), records_per_shard=4)
    assert result.counts["quarantined"] == 2
    assert sorted(ids_in(root, "run/input")) == list(range(15))


def test_assign_ids_for_records_without_one(root: Root) -> None:
    src = put(root, "noids.jsonl", b'{"q": 1}\n\n{"q": 2, "id": "keep"}\n{"q": 3}\n')
    result = shard(root, src, assign_ids=True)
    assert ids_in(root, "run/input") == ["noids.jsonl:1", "keep", "noids.jsonl:4"]
    assert result.counts["records"] == 3


def test_openai_batch_input_uses_custom_id(root: Root) -> None:
    rows = [
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": f"{i}+{i}?"}]},
        }
        for i in range(5)
    ]
    rows.append({"custom_id": "req-bad", "method": "POST", "body": "not an object"})
    result = shard(root, put(root, "batch.jsonl", jsonl(rows)))
    assert result.id_field == "custom_id"
    assert result.counts["records"] == 5 and result.counts["quarantined"] == 1
    assert ids_in(root, "run/input") == [f"req-{i}" for i in range(5)]


def test_explicit_id_field(root: Root) -> None:
    result = shard(root, put(root, "k.jsonl", b'{"key": "x"}\n{"key": "y"}\n'), id_field="key")
    assert result.id_field == "key" and result.counts["records"] == 2


def test_rerun_reuses_complete_output(root: Root) -> None:
    src = put(root, "data.jsonl", jsonl([{"id": i} for i in range(50)]))
    first = shard(root, src, records_per_shard=20)
    again = shard(root, src, records_per_shard=20)
    assert again.reused and not first.reused
    assert again.shards == first.shards and again.counts == first.counts


def test_rerun_after_interruption_redoes_cleanly(root: Root) -> None:
    src = put(root, "data.jsonl", jsonl([{"id": i} for i in range(50)] + [{"bad": 1}]))
    shard(root, src, records_per_shard=20)
    out = JsonlDir(root.uri("run", "input"), storage_options=root.storage_options)
    manifest = read_manifest(out)
    assert manifest is not None and manifest.complete
    # Simulate a run killed after two shards: manifest still in progress, a partial set of shards.
    out.loc.fs.rm(f"{out.loc.path}/part-00002.jsonl.zst")
    out.loc.fs.pipe_file(
        f"{out.loc.path}/_manifest.json",
        json.dumps(
            {
                "schema_version": OUTPUT_MANIFEST_VERSION,
                **manifest.model_dump(mode="json"),
                "state": "in_progress",
            }
        ).encode(),
    )
    redo = shard(root, src, records_per_shard=20)
    assert not redo.reused
    assert ids_in(root, "run/input") == list(range(50))  # nothing doubled, nothing missing
    assert redo.counts["quarantined"] == 1
    assert JsonlDir(redo.rejects_uri, storage_options=root.storage_options).count_records() == 1


def test_changed_settings_refuse_foreign_output_unless_overwrite(root: Root) -> None:
    src = put(root, "data.jsonl", jsonl([{"id": i} for i in range(50)]))
    shard(root, src, records_per_shard=20)
    with pytest.raises(OutputExistsError, match="overwrite=True"):
        shard(root, src, records_per_shard=10)
    result = shard(root, src, records_per_shard=10, overwrite=True)
    assert len(result.shards) == 5
    assert len(JsonlDir(root.uri("run", "input"), storage_options=root.storage_options).shards()) == 5


def test_unknown_shards_in_destination_are_refused(root: Root) -> None:
    out = JsonlDir(root.uri("run", "input"), storage_options=root.storage_options)
    with out.writer_sync() as w:
        w.write({"id": "someone else's"})
    with pytest.raises(OutputExistsError, match="unknown writer"):
        shard(root, put(root, "data.jsonl", b'{"id": 1}\n'))


def test_progress_reports_all_records_and_bytes(root: Root) -> None:
    data = jsonl([{"id": i} for i in range(3000)])
    seen = [0, 0]

    def progress(n: int, nbytes: int) -> None:
        seen[0] += n
        seen[1] += nbytes

    shard(root, put(root, "data.jsonl", data), progress=progress)
    assert seen == [3000, len(data)]


def test_empty_input_gives_no_shards(root: Root) -> None:
    result = shard(root, put(root, "empty.jsonl", b""))
    assert result.shards == [] and result.counts["lines"] == 0


def test_another_runs_rejects_are_never_deleted(root: Root) -> None:
    bad = b'{"id": 1}\n[]\n'
    first = shard_dataset(
        put(root, "a.jsonl", bad), root.uri("out", "a"), storage_options=root.storage_options
    )
    rejects = JsonlDir(first.rejects_uri, storage_options=root.storage_options)
    assert rejects.count_records() == 1
    with pytest.raises(OutputExistsError, match="rejects"):  # same default rejects/ beside out/b
        shard_dataset(put(root, "b.jsonl", bad), root.uri("out", "b"), storage_options=root.storage_options)
    assert rejects.count_records() == 1  # a's quarantined line is still there
    other = shard_dataset(
        put(root, "b.jsonl", bad),
        root.uri("out", "b"),
        rejects=root.uri("out", "b-rejects"),
        storage_options=root.storage_options,
    )
    assert other.counts["quarantined"] == 1
