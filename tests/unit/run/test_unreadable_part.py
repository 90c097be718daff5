"""Issue 38: a corrupt Parquet row group fails its shard, not the run. Its job fails and the shard is
quarantined; round 0's close then reads the range again (its id hashes, its ids) and used to fail on
the same row group at every retry, so the run could never finish. Now the close completes: the
shard's ``failed/`` record counts the ids read before the corrupt row group and names the part and
row groups it could not read, and the report says so, the run ending with failed shards."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from airflow_batchinfer.exceptions import CorruptFileError
from airflow_batchinfer.run.close import close_round
from airflow_batchinfer.run.jobs import round_kinds
from airflow_batchinfer.run.plan import propose_slot
from airflow_batchinfer.run.prepare import prepare_run
from airflow_batchinfer.run.report.build import build_report
from airflow_batchinfer.run.report.invariant import _RangeIds
from airflow_batchinfer.run.report.render import render_markdown
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import read_failed, write_plan
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlDir
from airflow_batchinfer.storage.manifest import read_manifest
from airflow_batchinfer.storage.ranges import DiscardRejects, read_range
from airflow_batchinfer.storage.shard_ref import RangeRef
from tests.support.parts import parquet_part, write_parts
from tests.support.worker_jobs import run_jobs

pq = pytest.importorskip("pyarrow.parquet")


def corrupt_second_row_group(path: Path) -> None:
    """Overwrite the pages of the ``q`` column in ``path``'s second row group (the footer intact)."""
    column = pq.ParquetFile(path).metadata.row_group(1).column(1)
    start = column.dictionary_page_offset if column.has_dictionary_page else column.data_page_offset
    data = bytearray(path.read_bytes())
    data[start : start + column.total_compressed_size] = b"\xff" * column.total_compressed_size
    path.write_bytes(bytes(data))
    assert pq.ParquetFile(io.BytesIO(bytes(data))).metadata.num_row_groups == 2  # its footer is intact


def test_a_corrupt_row_group_fails_its_shard_and_the_close_and_report_complete(tmp_path: Path) -> None:
    src = tmp_path / "data"
    parquet_part(src / "part-0.parquet", 0, 40, group=20)
    parquet_part(src / "part-1.parquet", 40, 40, group=20, q=[f"{i:04d}" * 500 for i in range(40)])
    parquet_part(src / "part-2.parquet", 80, 40, group=20)
    parquet_part(src / "part-3.parquet", 120, 40, group=20)
    corrupt_second_row_group(src / "part-1.parquet")
    cfg = RunConfig.of(
        input=str(src), run_root=str(tmp_path / "run"), prompt_template="{{ q }}", judge={"type": "llm"},
        records_per_shard=120, max_rounds=1, max_failed_shards=0,
    )  # fmt: skip
    shards = [s for s in prepare_run(cfg).shards if isinstance(s, RangeRef)]
    bad = [s for s in shards if any(p.uri.endswith("part-1.parquet") for p in s.pieces or ())]
    assert len(shards) == 2 and len(bad) == 1, [s.pieces for s in shards]
    assert [p.uri for p in bad[0].pieces or ()] == [str(src / f"part-{i}.parquet") for i in (0, 1, 2)]
    with pytest.raises(CorruptFileError):  # what fails its job, at every retry
        list(read_range(bad[0], id_field="id", assign_ids=False, rejects=DiscardRejects()))
    layout = RunLayout(cfg.run_root)
    plan = propose_slot(cfg, "round-00").plan
    write_plan(layout, plan)
    good = [s for s in plan.shards if s.shard_id != bad[0].shard_id]
    run_jobs(cfg, [(k, 0, s) for k in round_kinds(cfg, plan.mode) for s in good], approval_rate=1.0)

    summary = close_round(cfg, plan)  # before: CorruptFileError from the id hashes, every retry

    assert summary is not None and summary["invariant"]["ok"], summary
    failed = read_failed(layout, 0, bad[0].shard_id)
    assert failed is not None and failed.records == 80  # part-0's and part-2's ids: part-1 is skipped
    [unreadable] = failed.unreadable or []
    assert unreadable.part == str(src / "part-1.parquet") and "part-1.parquet" in unreadable.error
    assert unreadable.row_groups == [0, 2] and unreadable.records == 40
    # its lines as read: part-1's unread rows numbered still, so part-2's rows keep their lines
    manifest = read_manifest(JsonlDir(layout.input))
    assert manifest is not None
    assert {s.shard_id: (s.read or {}).get("lines") for s in manifest.ranges()}[failed.shard_id] == 120
    # the report's id check, when it reads ids: the range's ids before part-1, not an error
    assert len(list(_RangeIds(manifest, "id", None).ids(bad))) == 80
    write_plan(layout, propose_slot(cfg, "tail").plan)
    report = build_report(cfg)
    assert report["status"] == "failed_shards"
    [named] = report["invariant"]["unreadable"]
    assert named["shard_id"] == failed.shard_id and named["records"] == 40
    assert f"40 records of part `{src / 'part-1.parquet'}` (row groups [0, 2))" in render_markdown(report)


def test_a_part_removed_after_planning_fails_its_shard_and_the_close_completes(tmp_path: Path) -> None:
    src = tmp_path / "data"
    write_parts(src, [30, 30, 30, 30])
    cfg = RunConfig.of(
        input=str(src), run_root=str(tmp_path / "run"), prompt_template="{{ q }}", judge={"type": "llm"},
        records_per_shard=90, max_rounds=1,
    )  # fmt: skip
    shards = [s for s in prepare_run(cfg).shards if isinstance(s, RangeRef)]
    [bad] = [s for s in shards if any(p.uri.endswith("part-1.jsonl") for p in s.pieces or ())]
    assert len(bad.pieces or ()) == 3
    (src / "part-1.jsonl").unlink()  # its job fails: "part ... is gone since the run was planned"
    layout = RunLayout(cfg.run_root)
    plan = propose_slot(cfg, "round-00").plan
    write_plan(layout, plan)
    good = [s for s in plan.shards if s.shard_id != bad.shard_id]
    run_jobs(cfg, [(k, 0, s) for k in round_kinds(cfg, plan.mode) for s in good], approval_rate=1.0)

    summary = close_round(cfg, plan)

    assert summary is not None and summary["invariant"]["ok"], summary
    failed = read_failed(layout, 0, bad.shard_id)
    assert failed is not None and failed.records == 60  # part-0's and part-2's
    [gone] = failed.unreadable or []
    assert gone.part == str(src / "part-1.jsonl") and gone.range is not None and gone.records is None
    assert "is gone since the run was planned" in gone.error
    # a byte range's line count is unknown: the read counts say so (later rejects keep line_in_range)
    manifest = read_manifest(JsonlDir(layout.input))
    assert manifest is not None
    assert {s.shard_id: s.read for s in manifest.ranges()}[bad.shard_id]["unnumbered"] == 1  # type: ignore[index]
