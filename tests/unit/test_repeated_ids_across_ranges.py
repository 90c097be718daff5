"""An id in two byte ranges of round 0's input is never processed twice, and the run goes on: round
0's close keeps the first occurrence (the lowest line) and rejects every later one into
``rejects/`` with its line and the first's, leaving it out of that shard's accepted outputs, its
counts and its id digests (each range's job sees only its own range, so no job can find such a
repeat). The close finds them from the id hash files the range jobs wrote, without reading the
input again. The worker's job code runs every range's job (the SIMULATED engine), close runs as the
DAG's close task runs it."""

from __future__ import annotations

import json
import random
import re
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.exceptions import StorageError
from airflow_batchinfer.run.close import close_round
from airflow_batchinfer.run.jobs import round_kinds
from airflow_batchinfer.run.plan import pending_shards, propose_slot
from airflow_batchinfer.run.prepare import prepare_run
from airflow_batchinfer.run.report.invariant import check_invariant
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import AcceptedJob, Plan, Summary, read_accepted, read_failed, write_plan
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlDir, JsonlFile, files
from airflow_batchinfer.storage import id_hash_files as ihf
from airflow_batchinfer.storage import id_hashes as ih
from airflow_batchinfer.storage import ranges as ranges_mod
from airflow_batchinfer.storage.shard_ref import ShardRef
from tests.support.worker_jobs import run_jobs

pytestmark = pytest.mark.chaos


def setup_run(tmp_path: Path, lines: list[str]) -> tuple[RunConfig, Plan]:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "data.jsonl").write_text("\n".join(lines) + "\n")
    cfg = RunConfig.of(
        input=str(tmp_path / "data.jsonl"), run_root=str(tmp_path / "run"), prompt_template="{{ question }}",
        judge={"type": "llm"}, records_per_shard=10,
    )  # fmt: skip
    shards = prepare_run(cfg).shards
    assert len(shards) >= 3 and all(s.is_range for s in shards)
    plan = propose_slot(cfg, "round-00").plan
    write_plan(RunLayout(cfg.run_root), plan)
    return cfg, plan


def run_round(cfg: RunConfig, shards: list[ShardRef]) -> None:
    run_jobs(cfg, [(k, 0, s) for k in round_kinds(cfg, "rounds") for s in shards], approval_rate=0.5)


def round_zero(tmp_path: Path, lines: list[str]) -> tuple[RunConfig, Plan]:
    cfg, plan = setup_run(tmp_path, lines)
    run_round(cfg, plan.shards)
    return cfg, plan


def rows(n: int) -> list[str]:
    return [json.dumps({"id": f"r{i:02d}", "question": f"q {i}"}) for i in range(n)]


def repeated_input() -> list[str]:
    """r02 twice (lines 3 and 34), r05 three times (lines 6, 16 and 26), each in another range."""
    lines = rows(40)
    lines[33] = json.dumps({"id": "r02", "question": "again, in another range"})
    lines[15] = json.dumps({"id": "r05", "question": "a second time"})
    lines[25] = json.dumps({"id": "r05", "question": "a third time"})
    return lines


def repeat_rows(layout: RunLayout) -> list[dict[str, Any]]:
    found = [f for f in JsonlDir(layout.rejects).jsonl_files() if f.uri.endswith(ih.REJECTS_SUFFIX)]
    return sorted((row for f in found for row in f.iter_records()), key=lambda row: row["line_no"])


def kept_ids(layout: RunLayout) -> Counter[Any]:
    """Every id in results/ and in round 1's pending set, with how often."""
    found = JsonlDir(layout.results).jsonl_files() + JsonlDir(layout.pending(1)).jsonl_files()
    return Counter(row["id"] for f in found for row in f.iter_records())


def snapshot(layout: RunLayout) -> dict[str, bytes]:
    """The bytes of what round 0's close accepted and rejected."""
    out = {}
    for folder in (layout.results, layout.rejects, layout.rejected_dir(0), join_jobs(layout)):
        for name in files.names(folder, None):
            if name.endswith((".jsonl.zst", ".accepted.json")):
                out[f"{folder}/{name}"] = Path(f"{folder}/{name}").read_bytes()
    return out


def test_ids_repeated_across_ranges_are_rejected_and_round_zero_closes(tmp_path: Path) -> None:
    lines = repeated_input()
    cfg, plan = round_zero(tmp_path, lines)
    layout = RunLayout(cfg.run_root)
    summary = close_round(cfg, plan)
    assert summary is not None and summary["invariant"]["ok"], summary
    assert summary["repeated_ids"] == 3 and summary["ids"]["repeated"]["count"] == 3
    assert summary["approved"] + summary["rejected"] == 37  # 40 lines, 3 of them repeats
    # Each id once in results or pending; the replaced ids (r15, r25, r33) nowhere.
    expected = {f"r{i:02d}" for i in range(40)} - {"r15", "r25", "r33"}
    assert kept_ids(layout) == Counter(dict.fromkeys(expected, 1))
    got = repeat_rows(layout)
    assert [(row["id"], row["line_no"]) for row in got] == [("r05", 16), ("r05", 26), ("r02", 34)]
    assert [row["error"] for row in got] == ["id 'r05' repeated (first at line 6)"] * 2 + [
        "id 'r02' repeated (first at line 3)"
    ]
    assert all(row["shard_id"] != row["first_shard_id"] for row in got)
    assert len({row["shard_id"] for row in got[:2]} | {got[0]["first_shard_id"]}) == 3  # r05: three ranges
    assert "a third time" in got[1]["raw"] and all(row["source"] == cfg.data.input for row in got)
    # The shards' accepted docs agree with their files: counts and digests without the repeats.
    for sid in {row["shard_id"] for row in got}:
        doc = read_accepted(layout.accepted(0, sid, "infer_judge"))
        assert isinstance(doc, AcceptedJob) and doc.repeats is not None and doc.ids is not None
        assert doc.repeats.count == sum(row["shard_id"] == sid for row in got)
        for name in ("approved", "rejected"):
            rows_in = list(JsonlFile(doc.outputs[name]).iter_records())
            assert doc.ids[name].count == getattr(doc.counts.outcomes, name) == len(rows_in)
    # The report's invariant: from the digests, and by reading the ids (no digests to go by).
    pending = pending_shards(layout, 1)
    by_digest = check_invariant(layout, "id", pending, [Summary.model_validate(summary)], [], plans=[plan])
    assert by_digest["ok"] and by_digest["checked"] == "digests" and by_digest["input"] == 40, by_digest
    undigested = Summary.model_validate({**summary, "ids": {}})
    by_ids = check_invariant(layout, "id", [s.model_copy(update={"ids": None}) for s in pending],
                             [undigested], [], plans=[plan])  # fmt: skip
    assert by_ids["ok"] and by_ids["checked"] == "ids", by_ids
    # A re-run close changes nothing.
    before = snapshot(layout)
    again = close_round(cfg, plan)
    assert again is not None and again["invariant"]["ok"] and again["ids"] == summary["ids"]
    assert snapshot(layout) == before


def test_the_close_reads_the_input_only_to_confirm_a_match(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every range's job wrote its hash file (an id's hash and line): the close reads no range of the
    input when no id repeats across ranges, and just the ranges of a match when one does."""
    reads: list[tuple[int, int]] = []
    decoded = ranges_mod._decoded

    def counting(file: JsonlFile, start: int, end: int) -> Iterator[bytes]:
        reads.append((start, end))
        return decoded(file, start, end)

    for case, lines in (("unique", rows(40)), ("repeated", rows(40))):
        if case == "repeated":
            lines[33] = json.dumps({"id": "r02", "question": "again, in another range"})
        cfg, plan = round_zero(tmp_path / case, lines)
        layout = RunLayout(cfg.run_root)
        for s in plan.shards:  # written by the jobs, before the close
            assert ihf.read_lines(ihf.hashes_beside(layout.job_manifest(0, s.shard_id, "infer_judge"),
                                                  s.shard_id), None)  # fmt: skip
        monkeypatch.setattr(ranges_mod, "_decoded", counting)
        reads.clear()
        summary = close_round(cfg, plan)
        monkeypatch.setattr(ranges_mod, "_decoded", decoded)
        assert summary is not None and summary["invariant"]["ok"], summary
        if case == "unique":
            assert reads == []
        else:
            got = repeat_rows(layout)
            assert [(row["id"], row["line_no"]) for row in got] == [("r02", 34)]
            ranges = {s.shard_id: s.range_ref.range for s in plan.shards}
            assert sorted(reads) == sorted({ranges[got[0]["shard_id"]], ranges[got[0]["first_shard_id"]]})


def test_many_repeats_are_confirmed_reading_each_range_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A doubled export: every id of the first half again in the second, 6,000 matches (12,000 places,
    more than 10,000, what one confirmation batch held before) in hash order, so each batch touched
    nearly every range. Now every matched place is sorted by range and line (spilled: tiny sort
    memory) and each range is read once, whatever the number of matches."""
    half = 6_000
    lines = [json.dumps({"id": f"d{i}", "q": i}) for i in range(half)]
    lines += [json.dumps({"id": f"d{i}", "q": f"again {i}"}) for i in range(half)]
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(lines) + "\n")
    cfg = RunConfig.of(input=str(data), run_root=str(tmp_path / "run"), prompt_template="{{ q }}",
                       judge={"type": "llm"}, records_per_shard=2_000)  # fmt: skip
    shards = prepare_run(cfg).shards
    assert len(shards) >= 4 and all(s.is_range for s in shards)
    hashes = str(tmp_path / "hashes")

    def find() -> ih.Repeats:
        return ih.find_repeats(shards, lambda sid: f"{hashes}/{sid}{ihf.SUFFIX}", id_field="id",
                               assign_ids=False, so=None, spill=str(tmp_path / "spill"))  # fmt: skip

    find().close()  # writes the hash files (as the range jobs do), reading each range
    reads: list[tuple[int, int]] = []
    decoded = ranges_mod._decoded

    def counting(file: JsonlFile, start: int, end: int) -> Iterator[bytes]:
        reads.append((start, end))
        return decoded(file, start, end)

    monkeypatch.setattr(ranges_mod, "_decoded", counting)
    monkeypatch.setattr(ih, "SORT_BYTES", 4096, raising=False)  # many spilled runs
    monkeypatch.setattr(ih, "REPEATS_BATCH", 100, raising=False)
    with find() as repeats:
        assert repeats.count == half
        got = [x for s in shards for x in repeats.of(s.shard_id)]
    assert sorted(reads) == sorted(tuple(s.range) for s in shards)  # every range holds a match: once
    assert sorted((x.line, x.first_line) for x in got) == [(half + 1 + i, 1 + i) for i in range(half)]
    assert all(f'"q":"again {x.first_line - 1}"' in x.raw for x in got)  # each repeat's own record


@pytest.mark.security
def test_the_repeats_spill_under_the_run_root_not_the_workers_temp_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37, item 10: round 0's close spilled the matched places, the records read for them and
    the confirmed repeats to the Airflow worker's temp disk, in proportion to the repeats (a doubled
    export of 100M lines: tens of GB there, shared with every other task). Now they spill under the
    run root (``round-00/spill/``), on its store, and go as the close finishes."""
    half = 1_000
    lines = [json.dumps({"id": f"d{i}", "question": i}) for i in range(half)] * 2
    (tmp_path / "data.jsonl").write_text("\n".join(lines) + "\n")
    cfg = RunConfig.of(input=str(tmp_path / "data.jsonl"), run_root=str(tmp_path / "run"),
                       prompt_template="{{ question }}", judge={"type": "llm"},
                       records_per_shard=500)  # fmt: skip
    assert len(prepare_run(cfg).shards) >= 4
    plan = propose_slot(cfg, "round-00").plan
    layout = RunLayout(cfg.run_root)
    write_plan(layout, plan)
    run_round(cfg, plan.shards)
    monkeypatch.setattr(ih, "SORT_BYTES", 4096, raising=False)  # many spilled runs
    monkeypatch.setattr(ih, "REPEATS_BATCH", 100, raising=False)
    spilled: list[str] = []
    write = ih.SpillDir.write

    def recording(self: ih.SpillDir, name: str, data: bytes) -> str:
        spilled.append(path := write(self, name, data))
        return path

    def no_temp(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the close spilled to the local temp disk")

    monkeypatch.setattr(ih.SpillDir, "write", recording)
    for name in ("TemporaryFile", "TemporaryDirectory", "NamedTemporaryFile", "mkstemp", "mkdtemp"):
        monkeypatch.setattr(f"tempfile.{name}", no_temp)
    (Path(layout.spill(0)) / "stale").mkdir(parents=True)  # a killed close's: cleared first
    summary = close_round(cfg, plan)
    assert summary is not None and summary["invariant"]["ok"] and summary["repeated_ids"] == half
    assert len(spilled) > 10 and all(p.startswith(layout.spill(0) + "/") for p in spilled)
    assert not Path(layout.spill(0)).exists()  # removed as the close finished


def test_a_repeat_in_a_quarantined_shard_is_rejected_once_it_is_accepted(tmp_path: Path) -> None:
    lines = rows(40)
    lines[33] = json.dumps({"id": "r02", "question": "again, in another range"})
    cfg, plan = setup_run(tmp_path, lines)
    layout = RunLayout(cfg.run_root)
    offset = sum(len(x) + 1 for x in lines[:33])  # of line 34, the later occurrence
    later = next(s for s in plan.shards if s.range_ref.start <= offset < s.range_ref.end)
    run_round(cfg, [s for s in plan.shards if s is not later])
    summary = close_round(cfg, plan)  # the later occurrence's shard never ran: quarantined
    assert summary is not None and summary["invariant"]["ok"], summary
    assert summary["repeated_ids"] == 0 and repeat_rows(layout) == []
    failed = read_failed(layout, 0, later.shard_id)
    assert failed is not None and failed.repeated_ids is not None and failed.repeated_ids.count == 1
    assert "id 'r02' at line 34 (first at line 3)" in failed.repeated_ids.first
    run_round(cfg, [later])  # the DAG run re-run: its job runs, the close accepts it
    summary = close_round(cfg, plan)
    assert summary is not None and summary["invariant"]["ok"] and summary["repeated_ids"] == 1, summary
    assert [(row["id"], row["line_no"], row["shard_id"]) for row in repeat_rows(layout)] == [
        ("r02", 34, later.shard_id)
    ]
    assert kept_ids(layout)["r02"] == 1


def test_ids_unique_across_ranges_close_as_before_and_keep_hash_files(tmp_path: Path) -> None:
    lines = rows(40)
    lines[17] = json.dumps({"id": "r12", "question": "a repeat inside one range: its job rejects it"})
    cfg, plan = round_zero(tmp_path, lines)
    layout = RunLayout(cfg.run_root)
    summary = close_round(cfg, plan)
    assert summary is not None and summary["invariant"]["ok"] and summary["repeated_ids"] == 0, summary
    names = files.names(join_jobs(layout), None)
    assert sum(n.endswith(ihf.SUFFIX) for n in names) == len(plan.shards)
    assert repeat_rows(layout) == []
    # The repeat within a range: the job's reject, as before (same place, its own reason).
    bad = [row for f in JsonlDir(layout.rejects).jsonl_files() for row in f.iter_records()]
    assert [(row["line_no"], row["error"][:16]) for row in bad] == [(18, "duplicate id 'r1")]


def join_jobs(layout: RunLayout) -> str:
    return layout.round(0) + "/jobs"


def test_a_hash_collision_never_rejects_a_record() -> None:
    """Two different ids at the places of one hash (a collision) in two ranges are not a repeat."""
    got = ih.confirm([(0, 4, "a", "{}", None, None), (1, 2, "b", "{}", None, None)], ["p0", "p1"], [0, 10])
    assert got == []
    got = ih.confirm(
        [(0, 4, "a", "{}", None, None), (1, 2, "a", '{"id":"a"}', None, None)], ["p0", "p1"], [0, 10]
    )
    assert got == [ih.Repeat("a", "p0", 4, "p1", 12, 2, '{"id":"a"}')]


def test_hash_files_sort_and_merge_in_bounded_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Spilled sorted runs and matches split in buckets of the hashes' leading bits (here 16 of
    them: 408 lines, at most 50 entries matched at once) find the same shared hashes."""
    monkeypatch.setattr(ihf, "SPILL_HASHES", 7)
    monkeypatch.setattr(ihf, "BUCKET_ENTRIES", 50)
    uris = []
    for k in range(8):  # eight "ranges" of 50 ids; "shared" in ranges 2 and 6
        ids = [f"k{k}-{i}" for i in range(50)] + (["shared"] if k in (2, 6) else [])
        uri = str(tmp_path / f"r{k}.bin")
        ihf.write_hashes(uri, [(value, line) for line, value in enumerate(ids, 1)], lambda: 51, None)
        uris.append(uri)
    raw = (tmp_path / "r0.bin").read_bytes()[ihf.HEADER.size :]
    entries = [raw[i : i + ihf.ENTRY.size] for i in range(0, len(raw), ihf.ENTRY.size)]
    assert entries == sorted(entries) and len(entries) == 50
    # each entry keeps the id's line: k0-7 is on line 8
    assert ihf.ENTRY.pack(ihf.id_hash_bytes("k0-7"), 8) in entries
    assert list(ihf.shared_hashes(uris, None)) == [(ihf.id_hash_bytes("shared"), [(2, 51), (6, 51)])]
    assert ihf.read_lines(uris[0], None) == 51


@pytest.mark.parametrize("bucket_entries", [1 << 19, 1000, 37, 1])
def test_shared_hashes_match_every_hash_two_files_hold_whatever_the_bucket_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bucket_entries: int
) -> None:
    """Thirty files of random ids (repeated within and across files, some empty): the hashes found
    in two or more files, with every place of each, in hash order, as a dict over all entries says,
    in one bucket or split into many (a file's stretch of a bucket spans blocks, buckets are empty)."""
    monkeypatch.setattr(ihf, "BUCKET_ENTRIES", bucket_entries)
    monkeypatch.setattr(ihf, "MATCH_READ", 10 * ihf.ENTRY.size)  # many blocks per file
    rng = random.Random(7)
    uris, places = [], defaultdict(list)
    for k in range(30):
        ids = [f"x{rng.randrange(3000)}" for _ in range(rng.randrange(0, 200))]
        uri = str(tmp_path / f"r{k}.bin")
        ihf.write_hashes(uri, list(zip(ids, range(1, len(ids) + 1), strict=True)), lambda: 200, None)
        uris.append(uri)
        for line, v in enumerate(ids, 1):
            places[ihf.id_hash_bytes(v)].append((k, line))
    expected = [(h, sorted(at)) for h, at in sorted(places.items()) if len({k for k, _ in at}) > 1]
    assert len(expected) > 100
    assert list(ihf.shared_hashes(uris, None)) == expected


def test_a_hash_file_unreadable_once_written_is_a_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hash file close just wrote for a range reads back without its header (another writer,
    a store that lost it): an error naming the file, the shard and the remedy, not an assert."""
    shard = setup_run(tmp_path, rows(40))[1].shards[0]
    uri = str(tmp_path / f"{shard.shard_id}{ihf.SUFFIX}")
    monkeypatch.setattr(ih, "write_hashes", lambda to, *_: Path(to).write_bytes(b"not a hash file"))
    named = re.escape(f"shard {shard.shard_id}: the id hash file {uri} ")
    with pytest.raises(StorageError, match=named + ".*delete it and re-run round 0's close"):
        ih._range_hashes(shard.range_ref, uri, "id", False, None)
