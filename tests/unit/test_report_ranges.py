"""The report's read-the-ids fallback on a run whose round 0 read the input in place (range shards,
:mod:`airflow_batchinfer.storage.ranges`): the input side is each range read by its range (bad lines
dropped, ids assigned as the jobs assigned them), a quarantined round-0 shard accounts for its
range only, and the ids lost or doubled after close are named."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import zstandard

from airflow_batchinfer.run.plan import propose_slot
from airflow_batchinfer.run.report.build import build_report
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import write_plan
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlDir, JsonlFile
from tests.support.accounting import strip_digests
from tests.support.fake_jobs import read_rows, write_rows
from tests.support.ranges import ranged_round


def ranged_run(tmp_path: Path, name: str, data: bytes, **settings: Any) -> RunConfig:
    """Round 0 over range shards of ``data``: every shard's job runs but the last one's (quarantined),
    then close and the tail plan (``max_rounds=1``: the rejected rows stay pending)."""
    cfg, _, summary = ranged_round(tmp_path, name, data, max_rounds=1, max_failed_shards=1, **settings)
    assert summary["invariant"]["ok"], summary
    layout = RunLayout(cfg.run_root)
    write_plan(layout, propose_slot(cfg, "tail").plan)
    return cfg


def result_with_rows(cfg: RunConfig) -> str:
    layout = RunLayout(cfg.run_root)
    return next(f.uri for f in JsonlDir(layout.results).jsonl_files() if len(read_rows(f.uri)) >= 2)


def lose_one_double_another(cfg: RunConfig) -> tuple[Any, Any]:
    """Drop a result row and write another twice; returns (lost id, doubled id)."""
    uri = result_with_rows(cfg)
    rows = read_rows(uri)
    lost, doubled = rows[0]["id"], rows[1]["id"]
    write_rows(uri, [*rows[1:], rows[1]])
    return lost, doubled


def test_fallback_reads_range_shards_by_range_and_names_lost_and_doubled_ids(tmp_path: Path) -> None:
    lines = [json.dumps({"id": f"r{i:02d}", "question": f"q {i}"}) for i in range(40)]
    lines[5], lines[17] = "{bad", json.dumps({"id": "r12", "question": "again"})  # 38 ids, r12 twice
    cfg = ranged_run(tmp_path, "data.jsonl", ("\n".join(lines) + "\n").encode())
    assert build_report(cfg)["invariant"]["checked"] == "digests"

    strip_digests(cfg)  # no digests anywhere: the report reads the ids
    inv = build_report(cfg)["invariant"]
    assert inv["checked"] == "ids" and inv["ok"], inv  # the failed shard: its range, not the whole file
    assert (inv["input"], inv["accounted"]) == (38, 38)

    lost, doubled = lose_one_double_another(cfg)
    inv = build_report(cfg)["invariant"]
    assert inv["checked"] == "ids" and not inv["ok"]
    assert (inv["lost"], inv["doubled"], inv["unexpected"]) == ([lost], [doubled], [])
    assert (inv["input"], inv["accounted"]) == (38, 38)


def test_fallback_on_multi_frame_zstd_with_assigned_ids(tmp_path: Path) -> None:
    text = b"".join(json.dumps({"question": f"q {i}"}).encode() + b"\n" for i in range(60))
    cut = [0, 333, 700, 1000, 1400, len(text)]  # frames that end mid-line (as pzstd's do)
    frames = b"".join(zstandard.ZstdCompressor().compress(text[a:b]) for a, b in itertools.pairwise(cut))
    cfg = ranged_run(tmp_path, "data.jsonl.zst", frames, assign_ids=True)
    strip_digests(cfg)
    inv = build_report(cfg)["invariant"]
    assert inv["checked"] == "ids" and inv["ok"] and inv["input"] == 60, inv

    lost, doubled = lose_one_double_another(cfg)
    assert str(lost).startswith("data.jsonl.zst@") and "+" in str(lost)  # <name>@<frame>+<decoded offset>
    inv = build_report(cfg)["invariant"]
    assert (inv["ok"], inv["lost"], inv["doubled"], inv["unexpected"]) == (False, [lost], [doubled], [])


def test_a_quarantined_range_shard_counts_its_range_once(tmp_path: Path) -> None:
    lines = [json.dumps({"id": f"r{i:02d}", "question": f"q {i}"}) for i in range(30)]
    cfg = ranged_run(tmp_path, "data.jsonl", ("\n".join(lines) + "\n").encode())
    strip_digests(cfg)
    failed = build_report(cfg)["failed_shards"]
    assert len(failed) == 1 and failed[0]["uri"] == JsonlFile(cfg.data.input).uri  # names the source itself
    inv = build_report(cfg)["invariant"]
    assert inv["ok"] and inv["doubled"] == [] and (inv["input"], inv["accounted"]) == (30, 30), inv
