"""Round 0 over range shards (the input is read in place): the worker's job code validates each
range, and close writes the run's rejects with absolute line numbers and checks the id invariant."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from airflow_batchinfer.run.close import close_round
from airflow_batchinfer.run.plan import propose_slot
from airflow_batchinfer.run.prepare import prepare_run
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import write_plan
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlDir
from airflow_batchinfer.storage.manifest import read_manifest
from tests.support.ranges import ranged_round
from tests.support.worker_jobs import run_jobs


def input_counts(layout: RunLayout) -> dict[str, int] | None:
    manifest = read_manifest(JsonlDir(layout.input))
    return None if manifest is None else manifest.counts


def test_range_jobs_reject_bad_lines_and_close_numbers_them_absolutely(tmp_path: Path) -> None:
    lines = [json.dumps({"id": f"r{i:02d}", "question": f"q {i}"}) for i in range(40)]
    lines[5], lines[31], lines[17] = "{bad", "[]", json.dumps({"id": "r12", "question": "again"})
    cfg, _, summary = ranged_round(tmp_path, "data.jsonl", ("\r\n".join(lines) + "\r\n").encode())
    layout = RunLayout(cfg.run_root)
    assert summary["invariant"]["ok"], summary["invariant"]
    assert summary["pending"] == 37
    rejects = sorted(
        (r["line_no"], r["error"].split(" ")[0])
        for f in JsonlDir(layout.rejects).jsonl_files()
        for r in f.iter_records()
    )
    assert [n for n, _ in rejects] == [6, 18, 32]  # 1-based lines of the whole file
    counts = input_counts(layout)
    assert counts == {"lines": 40, "records": 37, "blank": 0, "skipped": 0, "quarantined": 3}


def test_a_rerun_close_numbers_rejects_from_every_range_not_only_the_planned_ones(tmp_path: Path) -> None:
    """A re-run plans only range shards with records (a range of bad lines drops out): close still
    counts the lines of every range, from the line counts the first close stored."""
    lines = [json.dumps({"id": f"r{i:02d}", "question": f"q {i}"}) for i in range(40)]
    lines[5], lines[31], lines[17] = "{bad", "[]", json.dumps({"id": "r12", "question": "again"})
    cfg, plan, _ = ranged_round(tmp_path, "data.jsonl", ("\n".join(lines) + "\n").encode())
    layout = RunLayout(cfg.run_root)

    def rejects() -> list[int]:
        return sorted(r["line_no"] for f in JsonlDir(layout.rejects).jsonl_files() for r in f.iter_records())

    counts = input_counts(layout)
    assert rejects() == [6, 18, 32]
    plan.shards = plan.shards[1:]  # as if the first range held no record: not planned again
    close_round(cfg, plan)
    assert rejects() == [6, 18, 32] and input_counts(layout) == counts


def test_single_frame_zstd_input_is_copied_and_a_rerun_reuses_it(tmp_path: Path) -> None:
    import zstandard

    rows = "".join(json.dumps({"id": f"r{i}", "question": "q"}) + "\n" for i in range(25))
    (tmp_path / "d.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(rows.encode()))
    settings: dict[str, Any] = {
        "input": str(tmp_path / "d.jsonl.zst"), "run_root": str(tmp_path / "run"),
        "prompt_template": "{{ question }}", "judge": {"type": "llm"}, "records_per_shard": 10,
    }  # fmt: skip
    first = prepare_run(RunConfig.of(**settings))
    assert [s.records for s in first.shards] == [10, 10, 5] and all(not s.is_range for s in first.shards)
    assert prepare_run(RunConfig.of(**settings)).reused  # a retried shard task: the copy is reused


def test_a_range_shard_whose_digests_disagree_is_opened_by_its_range_only(tmp_path: Path) -> None:
    """Close reads a disagreeing range shard's ids from its range (validated as its job read it),
    never the whole source: only the ids really lost or doubled are named."""
    from airflow_batchinfer.state.docs import read_job_manifest, write_job_manifest
    from airflow_batchinfer.storage import JsonlFile

    lines = [json.dumps({"id": f"r{i:02d}", "question": f"q {i}"}) for i in range(30)]
    lines[4] = "{bad"
    (tmp_path / "data.jsonl").write_text("\n".join(lines) + "\n")
    cfg = RunConfig.of(
        input=str(tmp_path / "data.jsonl"), run_root=str(tmp_path / "run"),
        prompt_template="{{ question }}", judge={"type": "llm"}, records_per_shard=10,
    )  # fmt: skip
    prepare_run(cfg)
    layout = RunLayout(cfg.run_root)
    plan = propose_slot(cfg, "round-00").plan
    write_plan(layout, plan)
    run_jobs(cfg, [("infer_judge", 0, s) for s in plan.shards], approval_rate=1.0)
    sid = plan.shards[0].shard_id
    manifest_uri = layout.job_manifest(0, sid, "infer_judge")
    m = read_job_manifest(manifest_uri)
    assert m is not None
    assert m.committed is not None and m.ids is not None
    staged = JsonlFile(m.committed["approved"])
    rows = list(staged.iter_records())
    with staged.writer_sync() as out:  # r00 lost, r01 doubled: the same count
        for row in [rows[1], *rows[1:]]:
            out.write(row)
    del m.ids["approved"]  # a manifest without that digest: close reads the files
    write_job_manifest(manifest_uri, m)
    summary = close_round(cfg, plan)
    assert summary is not None
    inv = summary["invariant"]
    assert not inv["ok"] and inv["opened"] == [sid]
    assert (inv["lost"], inv["doubled"], inv["unexpected"]) == (["r00"], ["r01"], [])


def test_a_changed_input_is_refused_on_resume_not_planned_again(tmp_path: Path) -> None:
    """The rounds read ranges of the file as it was: a resume over a changed file (or other sharding
    settings) is refused with the remedy, and the run's plan and counts stay as they are."""
    import pytest

    from airflow_batchinfer.exceptions import OutputExistsError

    lines = [json.dumps({"id": f"r{i:02d}", "question": f"q {i}"}) for i in range(30)]
    cfg, _, _ = ranged_round(tmp_path, "data.jsonl", ("\n".join(lines) + "\n").encode())
    layout = RunLayout(cfg.run_root)
    before = read_manifest(JsonlDir(layout.input))
    assert prepare_run(cfg).reused  # the same file: the plan is reused
    with (tmp_path / "data.jsonl").open("a") as f:
        f.write(json.dumps({"id": "late", "question": "q"}) + "\n")
    with pytest.raises(
        OutputExistsError, match=r"restore the file \(an object store.s same bytes; .*\), or start a new run"
    ):
        prepare_run(cfg)
    assert read_manifest(JsonlDir(layout.input)) == before
