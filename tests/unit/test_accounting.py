"""Accounting that scales (issue 12): close and report check the id invariant from the digests in
manifests and summaries, in O(shards), reading no row on the happy path; only a shard whose digests
disagree (or that has none: a run started before digests) is opened, and its lost or doubled ids
are named. Real files on local disk; jobs finished as a worker would (tests.support.fake_jobs)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import airflow_batchinfer.run.close as round_close
from airflow_batchinfer.exceptions import StorageError
from airflow_batchinfer.run.plan import ACCEPT, apply_choice, propose_slot
from airflow_batchinfer.run.report.build import build_report
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import (
    DOC_VERSION,
    MANIFEST_VERSION,
    read_job_manifest,
    read_summary,
    write_plan,
)
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlFile, RecompactResult
from airflow_batchinfer.storage.digest import IdDigest
from airflow_batchinfer.storage.jsonl_dir import JsonlDir
from airflow_batchinfer.storage.manifest import read_manifest
from airflow_batchinfer.storage.shard_ref import ShardRef
from tests.support.accounting import strip_digests
from tests.support.fake_jobs import (
    IDS,
    close,
    counted,
    finish_job,
    finish_shard,
    make_run,
    plan_round,
    read_rows,
    write_rows,
)


def evens(shard: ShardRef) -> set[str]:
    return {r["id"] for r in JsonlFile(shard.uri).iter_records() if int(r["id"][1:]) % 2 == 0}


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every JSONL file whose lines are read from now on (rows, ids or bulk blocks)."""
    seen: list[str] = []
    lines, blocks = JsonlFile.iter_lines, JsonlFile.iter_line_blocks

    def iter_lines(self: JsonlFile) -> Iterator[tuple[int, bytes]]:
        seen.append(self.uri)
        return lines(self)

    def iter_line_blocks(self: JsonlFile) -> Iterator[list[bytes]]:
        seen.append(self.uri)
        return blocks(self)

    monkeypatch.setattr(JsonlFile, "iter_lines", iter_lines)
    monkeypatch.setattr(JsonlFile, "iter_line_blocks", iter_line_blocks)
    return seen


def judge_rows(cfg: RunConfig, shard: ShardRef, approve: set[str]) -> tuple[list[Any], list[Any]]:
    """The rows a fused infer_judge job would approve and reject for ``shard``."""
    rows = [{**r, "result": "x", "status": "ok"} for r in read_rows(shard.uri)]
    ok = [{**r, "status": "approved"} for r in rows if r["id"] in approve]
    bad = [{**r, "status": "rejected"} for r in rows if r["id"] not in approve]
    return ok, bad


# --------------------------------------------------------------------------------------- close
def test_close_checks_the_invariant_from_digests_without_reading_results(
    tmp_path: Path, reads: list[str]
) -> None:
    cfg = make_run(tmp_path)
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg)
    # the plan carries the digests
    assert all(s.ref.ids is not None and s.ref.ids.count == s.records for s in plan.shards)
    for s in plan.shards:
        finish_shard(cfg, 0, s, evens(s))
    reads.clear()
    summary = close(cfg, plan)
    inv = summary["invariant"]
    assert inv["ok"] and inv["opened"] == [] and inv["lost"] == inv["doubled"] == inv["unexpected"] == []
    # the only rows close reads are the rejected ones it recompacts into the next pending set
    assert reads and all(u.startswith(layout.rejected_dir(0) + "/") for u in reads), reads
    ids = {k: IdDigest.from_dict(v) for k, v in summary["ids"].items()}
    assert ids["planned"] == IdDigest.of(IDS) == ids["approved"] + ids["rejected"] + ids["failed"]
    assert ids["approved"] == IdDigest.of(i for i in IDS if int(i[1:]) % 2 == 0)
    assert ids["next_pending"] == ids["rejected"] and ids["failed"] == IdDigest()
    nxt = read_manifest(JsonlDir(layout.pending(1)))
    assert nxt is not None and nxt.ids is not None and IdDigest.from_dict(nxt.ids) == ids["rejected"]
    assert all(d.ids is not None for d in nxt.shards)  # the next round's plan carries digests again


def test_a_count_preserving_swap_in_one_shard_is_caught_and_named(tmp_path: Path, reads: list[str]) -> None:
    """A judge that lost r03 and wrote r04 twice: the counts add up, the digests do not."""
    cfg = make_run(tmp_path)
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg)
    for s in plan.shards[1:]:
        finish_shard(cfg, 0, s, evens(s))
    bad = plan.shards[0]
    ok, rejected = judge_rows(cfg, bad, evens(bad))
    rejected = [r for r in rejected if r["id"] != "r03"]
    ok.append(next(r for r in ok if r["id"] == "r04"))
    finish_job(
        cfg, "infer_judge", 0, bad, {"approved": ok, "rejected": rejected}, counted(approved=6, rejected=4)
    )
    reads.clear()
    summary = close(cfg, plan)
    inv = summary["invariant"]
    assert (inv["planned"], inv["accounted"]) == (30, 30)  # the counts alone would pass
    assert not inv["ok"] and inv["lost"] == ["r03"] and inv["doubled"] == ["r04"] and inv["unexpected"] == []
    assert inv["opened"] == [bad.shard_id]  # only the shard whose digests disagree is read
    other = {layout.result(0, s.shard_id) for s in plan.shards[1:]}
    assert not other & set(reads)
    report = build_report(cfg)
    assert report["invariant"]["checked"] == "digests"
    assert (report["invariant"]["lost"], report["invariant"]["doubled"]) == (["r03"], ["r04"])
    assert not report["invariant"]["ok"]


def test_a_manifest_whose_digest_is_wrong_is_opened_and_the_files_decide(tmp_path: Path) -> None:
    cfg = make_run(tmp_path)
    plan = plan_round(cfg)
    for s in plan.shards[:2]:
        finish_shard(cfg, 0, s, evens(s))
    s = plan.shards[2]
    ok, rejected = judge_rows(cfg, s, evens(s))
    finish_job(
        cfg, "infer_judge", 0, s, {"approved": ok, "rejected": rejected}, counted(approved=5, rejected=5),
        ids={"approved": IdDigest.of(["nope"])},
    )  # fmt: skip
    summary = close(cfg, plan)
    inv = summary["invariant"]
    assert inv["ok"] and inv["opened"] == [s.shard_id] and inv["lost"] == []
    approved = IdDigest.of(i for i in IDS if int(i[1:]) % 2 == 0)
    assert IdDigest.from_dict(summary["ids"]["approved"]) == approved


def test_quarantined_shards_account_for_their_planned_digest(tmp_path: Path, reads: list[str]) -> None:
    cfg = make_run(tmp_path)
    plan = plan_round(cfg)
    finish_shard(cfg, 0, plan.shards[0], evens(plan.shards[0]))  # the other two never finish
    reads.clear()
    summary = close(cfg, plan)
    assert summary["invariant"]["ok"] and summary["invariant"]["opened"] == []
    failed = {f["shard_id"]: f for f in summary["failed_shards"]}
    assert IdDigest.from_dict(summary["ids"]["failed"]) == IdDigest.of(IDS[10:])
    assert all(failed[s.shard_id]["ids"] == s.to_json()["ids"] for s in plan.shards[1:])
    assert not {s.uri for s in plan.shards} & set(reads)


def test_a_recompaction_that_doubles_a_row_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = make_run(tmp_path)
    plan = plan_round(cfg)
    for s in plan.shards:
        finish_shard(cfg, 0, s, evens(s))
    real = round_close.recompact

    def doubling(*args: Any, **kwargs: Any) -> RecompactResult:
        out = real(*args, **kwargs)
        first = out.shards[0]
        rows = read_rows(first.uri)
        write_rows(first.uri, [*rows, rows[0]])  # a bug that writes one row twice
        ids = IdDigest.from_dict(out.ids or {}) + IdDigest.of([rows[0]["id"]])
        return RecompactResult(out.shards, out.records, out.sources, ids=ids.to_dict())

    monkeypatch.setattr(round_close, "recompact", doubling)
    summary = close(cfg, plan)
    inv = summary["invariant"]
    assert not inv["ok"] and inv["doubled"] == ["r01"] and inv["opened"] == []


def test_a_run_without_digests_closes_and_reports_by_reading_ids(tmp_path: Path) -> None:
    cfg = make_run(tmp_path, max_rounds=1)
    plan = plan_round(cfg)
    for s in plan.shards[:2]:
        finish_shard(cfg, 0, s, evens(s))
    strip_digests(cfg)
    plan = plan_round(cfg)  # descriptors without ids
    assert all(s.ref.ids is None for s in plan.shards)
    summary = close(cfg, plan)
    inv = summary["invariant"]
    assert inv["ok"] and inv["opened"] == [s.shard_id for s in plan.shards]  # every shard read
    assert IdDigest.from_dict(summary["ids"]["planned"]) == IdDigest.of(IDS)

    write_plan(RunLayout(cfg.run_root), propose_slot(cfg, "tail").plan)
    strip_digests(cfg)  # and the summary and the next pending set too
    report = build_report(cfg)
    assert report["invariant"]["checked"] == "ids" and report["invariant"]["ok"], report["invariant"]
    assert (report["invariant"]["input"], report["invariant"]["accounted"]) == (30, 30)


def test_a_next_pending_set_without_its_digest_is_refused_with_the_remedy(tmp_path: Path) -> None:
    cfg = make_run(tmp_path)
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg)
    for s in plan.shards:
        finish_shard(cfg, 0, s, evens(s))
    close(cfg, plan)
    manifest = Path(layout.pending(1), "_manifest.json")
    doc = json.loads(manifest.read_text())
    doc.pop("ids")
    manifest.write_text(json.dumps(doc))
    with pytest.raises(StorageError, match=r"pending.*without its ids' digest.*delete it"):
        close(cfg, plan)  # a resumed run's close reuses the recompaction: it must carry its digest


def test_the_fallback_names_an_id_lost_after_close(tmp_path: Path) -> None:
    cfg = make_run(tmp_path, max_rounds=1)
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg)
    for s in plan.shards:
        finish_shard(cfg, 0, s, evens(s))
    close(cfg, plan)
    write_plan(layout, propose_slot(cfg, "tail").plan)
    strip_digests(cfg)
    result = layout.result(0, plan.shards[1].shard_id)
    write_rows(result, [r for r in read_rows(result) if r["id"] != "r12"])
    inv = build_report(cfg)["invariant"]
    assert inv["checked"] == "ids" and not inv["ok"] and inv["lost"] == ["r12"] and inv["accounted"] == 29


# -------------------------------------------------------------------------------------- report
def test_report_checks_a_whole_run_from_digests_reading_no_row(tmp_path: Path, reads: list[str]) -> None:
    cfg = make_run(tmp_path, max_rounds=2)
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg)
    for s in plan.shards:
        finish_shard(cfg, 0, s, evens(s))
    close(cfg, plan)
    plan = plan_round(cfg, "round-01")
    for s in plan.shards:
        finish_shard(cfg, 1, s, {"r01", "r03"})
    close(cfg, plan)
    tail = plan_round(cfg, "tail")
    assert tail.stop is not None and tail.records == 13
    reads.clear()
    report = build_report(cfg)
    assert reads == []  # not a row of input, results or pending
    assert report["invariant"] == {
        "input": 30, "accounted": 30, "lost": [], "doubled": [], "unexpected": [], "ok": True,
        "checked": "digests",
    }  # fmt: skip
    assert report["remaining_pending"] == 13 and read_summary(layout, 1) is not None


def test_report_counts_rows_a_review_accepted_from_the_plan(tmp_path: Path) -> None:
    cfg = make_run(tmp_path, review="every_round")
    plan = plan_round(cfg)
    for s in plan.shards:
        finish_shard(cfg, 0, s, evens(s))
    close(cfg, plan)
    accepted = apply_choice(cfg, propose_slot(cfg, "round-01"), ACCEPT)
    assert accepted.accepted is not None
    assert accepted.accepted.digest() == IdDigest.of(i for i in IDS if int(i[1:]) % 2)
    write_plan(RunLayout(cfg.run_root), accepted)
    report = build_report(cfg)
    assert report["invariant"]["checked"] == "digests" and report["invariant"]["ok"], report["invariant"]
    assert report["accepted_by_review"] == 15


def test_in_place_rounds_account_for_exhausted_rows(tmp_path: Path) -> None:
    cfg = make_run(tmp_path, strategy="in_place", max_attempts=2)
    plan = plan_round(cfg, "tail")
    for s in plan.shards:
        rows = read_rows(s.uri)
        ok = [{**r, "status": "approved"} for r in rows if r["id"] in evens(s)]
        out = [{**r, "status": "max_attempts"} for r in rows if r["id"] not in evens(s)]
        finish_job(cfg, "in_place", 0, s, {"approved": ok, "rejected": out},
                   counted(approved=len(ok), max_attempts=len(out)))  # fmt: skip
    summary = close(cfg, plan)
    assert summary["invariant"]["ok"] and summary["invariant"]["opened"] == []
    assert IdDigest.from_dict(summary["ids"]["exhausted"]) == IdDigest.of(i for i in IDS if int(i[1:]) % 2)
    report = build_report(cfg)
    assert report["invariant"]["checked"] == "digests" and report["invariant"]["ok"]


def test_summary_and_manifests_carry_their_versions(tmp_path: Path) -> None:
    """The summary is at the run documents' version (DOC_VERSION); a manifest at its own (2: its
    counts a Tally)."""
    cfg = make_run(tmp_path)
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg)
    finish_shard(cfg, 0, plan.shards[0], evens(plan.shards[0]))
    uri = layout.job_manifest(0, plan.shards[0].shard_id, "infer_judge")
    m = read_job_manifest(uri)
    assert m is not None and json.loads(Path(uri).read_text())["schema_version"] == MANIFEST_VERSION == 2
    assert set(m.ids or {}) == {"input", "approved", "rejected"}
    pending = plan.shards[0].uri
    assert m.digest("input") == IdDigest.of(r["id"] for r in read_rows(pending))
    summary = close(cfg, plan)
    assert (
        json.loads(Path(layout.summary(0)).read_text())["schema_version"] == DOC_VERSION and "ids" in summary
    )
