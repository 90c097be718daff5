"""The ``batchinfer`` command as a user runs it (a real subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from airflow_batchinfer.storage import JsonlDir

BIN = str(Path(sys.executable).parent / "batchinfer")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120)


def test_shard_then_recompact(tmp_path: Path) -> None:
    src = tmp_path / "data.jsonl"
    src.write_text("".join(json.dumps({"id": i, "q": f"{i}+1"}) + "\n" for i in range(250)) + "not json\n")
    out = run("shard", str(src), str(tmp_path / "run" / "input"), "--records-per-shard", "100")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["shards"] == 3
    assert summary["counts"]["records"] == 250 and summary["counts"]["quarantined"] == 1
    assert summary["rejects"] == str(tmp_path / "run" / "rejects")

    out = run(
        "recompact", str(tmp_path / "run" / "input"), str(tmp_path / "pending"), "--records-per-shard", "120"
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["shards"] == 3
    assert [r["id"] for r in JsonlDir(str(tmp_path / "pending")).iter_records()] == list(range(250))


def test_shard_takes_the_input_bounds_of_a_run(tmp_path: Path) -> None:
    src = tmp_path / "data.jsonl"
    rows = [{"id": "a"}, {"id": "b", "q": "y" * 5000}, {"id": "c" * 40}, {"id": "d"}]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = run("shard", str(src), str(tmp_path / "input"), "--max-line-bytes", "1024", "--max-id-bytes", "32")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["counts"]["quarantined"] == 2
    assert [r["id"] for r in JsonlDir(str(tmp_path / "input")).iter_records()] == ["a", "d"]
    rejects = [r for r in JsonlDir(str(tmp_path / "rejects")).iter_records()]
    assert sorted(r["line_no"] for r in rejects) == [2, 3]
    assert "max_line_bytes" in rejects[0]["error"] + rejects[1]["error"]


def test_errors_are_one_clear_line_and_exit_code_1(tmp_path: Path) -> None:
    src = tmp_path / "bad.jsonl"
    src.write_text('{"id": 1}\n[]\n')
    out = run("shard", str(src), str(tmp_path / "out"), "--on-error", "raise")
    assert out.returncode == 1
    assert "bad.jsonl, line 2: expected a JSON object" in out.stderr
    assert "Traceback" not in out.stderr

    out = run("shard", str(tmp_path / "missing.jsonl"), str(tmp_path / "out2"))
    assert out.returncode == 1 and "missing.jsonl" in out.stderr


def test_progress_bar_is_quiet_when_not_a_terminal(tmp_path: Path) -> None:
    src = tmp_path / "d.jsonl"
    src.write_text('{"id": 1}\n')
    out = run("shard", str(src), str(tmp_path / "o"))
    assert out.returncode == 0 and out.stderr == ""


def test_version_and_help() -> None:
    assert run("--version").stdout.startswith("batchinfer 0.1.0")
    assert "shard" in run("--help").stdout
    assert run("shard").returncode == 2  # argparse usage error


def test_module_entry_point() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "airflow_batchinfer.cli", "--version"], capture_output=True, text=True
    )
    assert out.returncode == 0 and "0.1.0" in out.stdout
