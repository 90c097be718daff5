"""``batchinfer plan``: the sizing table (or JSON) as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_batchinfer.cli import main

BIN = str(Path(sys.executable).parent / "batchinfer")
EXAMPLE = ["plan", "--records", "100000000", "--gpus", "32", "--concurrency", "10", "--tokens-per-s", "2500"]


def test_plan_prints_the_table() -> None:
    out = subprocess.run([BIN, *EXAMPLE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("100,000,000 records on 32 GPUs × 10 jobs = 320 slots")
    pool = 'airflow pools set batchinfer 320 "batchinfer shard slots" --include-deferred'
    assert lines[1] == f"Airflow pool: {pool}"
    row = next(line for line in lines if line.startswith("0 "))
    assert row.split()[:7] == ["0", "rounds", "100,000,000", "960", "104,167", "3", "(3.00)"]
    assert "960 of 1,024" in row and "138.9 h" in row and "4,444.5" in row
    assert any(line.startswith("total: 1 round") for line in lines)


def test_plan_json_and_flags(capsys: pytest.CaptureFixture[str]) -> None:
    args = [*EXAMPLE, "--records-per-shard", "100000", "--approval-rate", "0.8", "--max-rounds", "2",
            "--tokens-per-record", "400", "--max-map-length", "2048", "--airflow-pool", "gpu",
            "--json"]  # fmt: skip
    assert main(args) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["slots"] == 320 and plan["max_map_length"] == 2048 and plan["airflow_pool"] == "gpu"
    assert [(r["shards"], r["waves"]) for r in plan["rounds"]] == [(1000, 4), (200, 1)]
    assert plan["expected_passes"] == pytest.approx(1.2)
    # with 2,048 tasks a round: 1,920 shards, six full waves
    assert any("records_per_shard=52,084 makes 1,920 shards in 6 waves" in n for n in plan["notes"])


def test_plan_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--records", "100000000", "--gpus", "0", "--tokens-per-s", "2500"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == "batchinfer plan: error: gpus must be a whole number >= 1, got 0"
    assert main([*EXAMPLE, "--records-per-shard", "1000"]) == 1
    err = capsys.readouterr().err
    assert "100,000 shards" in err and "records_per_shard >= 97,657" in err and "\n" not in err.strip()
