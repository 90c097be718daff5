"""``batchinfer plan``: the sizing table (or JSON) as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_batchinfer.cli import main
from airflow_batchinfer.run.sizing import plan_run
from airflow_batchinfer.run.sizing_plan import SizingPlan

BIN = str(Path(sys.executable).parent / "batchinfer")
EXAMPLE = ["plan", "--records", "100000000", "--gpus", "32", "--concurrency", "10", "--tokens-per-s", "2500"]


def test_plan_prints_the_table_and_the_shape_before_lanes() -> None:
    out = subprocess.run([BIN, *EXAMPLE, "--chunk-size", "2000"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("100,000,000 records on 32 GPUs × 10 jobs = 320 slots")
    assert lines[0].endswith("the slowest GPU 1.5× slower")
    pool = 'airflow pools set batchinfer 320 "batchinfer shard slots" --include-deferred'
    assert lines[1] == f"Airflow pool: {pool}"
    assert lines[2] == "shards of 2,000 records (chosen: jobs of at most 60.0 min)"
    assert lines[3] == "round 0's last shards taper down to 1,000 records, so that its lanes end together"
    row = next(line for line in lines if line.startswith("0 "))
    assert row.split()[:5] == ["0", "rounds", "100,000,000", "50,443", "2,000"]
    assert "320 of 1,024" in row and "53.3 min (80.0 min slowest)" in row
    assert any(line.startswith("total: 1 round") for line in lines)
    assert not any("one task per shard" in line for line in lines)  # one shape: lanes


def test_plan_json_round_trips_and_takes_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    args = [*EXAMPLE, "--records-per-shard", "100000", "--approval-rate", "0.8", "--max-rounds", "2",
            "--tokens-per-record", "400", "--max-map-length", "2048", "--airflow-pool", "gpu",
            "--lanes", "1500", "--chunk-size", "1000", "--straggler", "1.0", "--max-job-s", "1800",
            "--execution-timeout-hours", "100", "--json"]  # fmt: skip
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    plan = SizingPlan.from_dict(data)
    assert plan == plan_run(
        100_000_000, 32, 2500, concurrency=10, records_per_shard=100_000, approval_rate=0.8, max_rounds=2,
        max_map_length=2048, airflow_pool="gpu", lanes=1500, chunk_size=1000, straggler=1.0, max_job_s=1800,
        execution_timeout_s=100 * 3600,
    )  # fmt: skip
    assert (plan.lanes, plan.lanes_setting, plan.max_map_length, plan.chunk_size) == (1500, 1500, 2048, 1000)
    # round 0 tapered for the 320 lanes that run at once: 2,330 shards, 1,500 mapped lanes
    assert [(r.shards, r.lanes, r.mapped_tasks) for r in plan.rounds] == [(2330, 320, 1500), (200, 200, 200)]
    assert plan.expected_passes == pytest.approx(1.2) and plan.lost_records_per_failure == 10 * 1000
    assert any("more than the pool's 320 slots" in n for n in plan.notes)


def test_plan_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--records", "100000000", "--gpus", "0", "--tokens-per-s", "2500"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == "batchinfer plan: error: gpus must be a whole number >= 1, got 0"
    assert main([*EXAMPLE, "--lanes", "2000"]) == 1
    err = capsys.readouterr().err
    assert "2,000 lanes" in err and "--lanes) to at most 1,024" in err and "\n" not in err.strip()
    assert main([*EXAMPLE, "--straggler", "0.9"]) == 1
    assert "straggler must be a finite number >= 1" in capsys.readouterr().err


def test_the_operations_guide_shows_the_real_output() -> None:
    guide = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    command = "$ batchinfer plan --records 100000000 --gpus 32 --concurrency 10 --tokens-per-s 2500\n"
    shown = guide.split(command, 1)[1].split("```", 1)[0]
    out = subprocess.run([BIN, *EXAMPLE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and shown == out.stdout


def test_plan_sizes_a_fan_outs_rows(capsys: pytest.CaptureFixture[str]) -> None:
    """``--arms``: each record runs once per adapter (fan_out), so the plan sizes records × arms rows."""
    assert main([*EXAMPLE, "--arms", "3", "--json"]) == 0
    plan = SizingPlan.from_dict(json.loads(capsys.readouterr().out))
    assert plan == plan_run(300_000_000, 32, 2500, concurrency=10)
    assert main([*EXAMPLE, "--arms", "0"]) == 1
    assert "--arms must be >= 1 (1: no fan-out), got 0" in capsys.readouterr().err
