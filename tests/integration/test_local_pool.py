"""The local pool and ``batchinfer run``, as a user drives them: real CLI, real worker processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.pools import LocalPool, LocalPoolSpec
from airflow_batchinfer.storage import JsonlDir

pytestmark = pytest.mark.slow
BIN = str(Path(sys.executable).parent / "batchinfer")


def cli(*args: str, env: dict[str, str], timeout: float = 300) -> dict[str, Any]:
    out = subprocess.run([BIN, *args], capture_output=True, text=True, env=env, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "BATCHINFER_CACHE": str(tmp_path / "cache")}


def dataset(tmp_path: Path, n: int) -> Path:
    src = tmp_path / "data" / "arith.jsonl"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "question": f"{i} + {i}", "answer": 2 * i}) + "\n" for i in range(n)
        )
    )
    return src


def test_pool_up_reuses_warm_workers_and_down_stops_them(tmp_path: Path, env: dict[str, str]) -> None:
    args = ["--name", "t", "--replicas", "2", "--engine", "simulated", "--allow-prefix", str(tmp_path)]
    up = cli("pool", "up", *args, env=env)
    assert len(up["workers"]) == 2
    again = cli("pool", "up", *args, env=env)
    assert again["workers"] == up["workers"]  # the same warm processes
    status = cli("pool", "status", "--name", "t", env=env)
    assert [w["alive"] and w["ready"] for w in status["workers"]] == [True, True]
    assert oct(Path(up["token_file"]).stat().st_mode & 0o777) == "0o600"
    down = cli("pool", "down", "--name", "t", env=env)
    assert down["stopped"] == 2
    assert cli("pool", "status", "--name", "t", env=env)["workers"] == []
    assert LocalPool("t", state_dir=Path(env["BATCHINFER_CACHE"]) / "pools").urls() == []


def test_changed_spec_replaces_workers(tmp_path: Path) -> None:
    pool = LocalPool("x", state_dir=tmp_path / "pools")
    spec = LocalPoolSpec(engine="simulated", replicas=1, allowed_prefixes=(str(tmp_path),))
    try:
        first = pool.up(spec)
        second = pool.up(
            LocalPoolSpec(engine="simulated", replicas=1, concurrency=7, allowed_prefixes=(str(tmp_path),))
        )
        assert first != second
        assert pool.status()["spec"]["concurrency"] == 7
    finally:
        pool.down()


def test_idle_ttl_lets_workers_exit(tmp_path: Path) -> None:
    pool = LocalPool("idle", state_dir=tmp_path / "pools")
    pool.up(LocalPoolSpec(engine="simulated", idle_ttl_s=1.0, allowed_prefixes=(str(tmp_path),)))
    deadline = time.monotonic() + 30
    while pool.urls() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pool.urls() == []


def test_run_rounds_end_to_end_accounts_for_every_id(tmp_path: Path, env: dict[str, str]) -> None:
    src = dataset(tmp_path, 600)
    root = tmp_path / "run"
    out = cli(
        "run",
        str(src),
        str(root),
        "--name",
        "r",
        "--engine",
        "simulated",
        "--engine-arg",
        "approval_rate=0.5",
        "--prompt-template",
        "What is {{ question }}?",
        "--judge",
        '{"type": "llm"}',
        "--max-rounds",
        "3",
        "--records-per-shard",
        "200",
        "--replicas",
        "2",
        env=env,
    )
    try:
        assert out["invariant"]["ok"], out["invariant"]
        rounds = out["rounds"]
        assert [r["round"] for r in rounds] == [0, 1, 2]
        assert rounds[0]["pending"] == 600
        assert rounds[1]["pending"] == rounds[0]["rejected"]  # the rejected set is the next round's input
        assert out["approved"] + out["remaining_pending"] == 600
        assert out["stop_reason"] == "max_rounds reached"
        approved_ids = [
            r["id"] for f in JsonlDir(str(root / "results")).jsonl_files() for r in f.iter_records()
        ]
        assert len(approved_ids) == len(set(approved_ids)) == out["approved"]
        assert json.loads((root / "report" / "summary.json").read_text())["approved"] == out["approved"]
        assert (root / "round-01" / "pending").is_dir() and (root / "round-00" / "summary.json").exists()
        rows = list(JsonlDir(str(root / "round-01" / "rejected")).iter_records())
        assert rows and all(r["attempts"] == 2 and r["round"] == 1 for r in rows)
    finally:
        cli("pool", "down", "--name", "r", env=env)


def test_run_in_place_and_hybrid(tmp_path: Path, env: dict[str, str]) -> None:
    src = dataset(tmp_path, 300)
    try:
        # hybrid: rounds approve 20% (shrinking the pending set less than the 30% threshold), so
        # the tail switches to in-place retry after the first round
        for strategy, rate in (("in_place", 0.4), ("hybrid", 0.2)):
            root = tmp_path / f"run-{strategy}"
            out = cli(
                "run",
                str(src),
                str(root),
                "--name",
                "ip",
                "--engine",
                "simulated",
                "--engine-arg",
                f"approval_rate={rate}",
                "--prompt-template",
                "{{ question }}",
                "--strategy",
                strategy,
                "--max-attempts",
                "4",
                "--max-rounds",
                "3",
                env=env,
            )
            assert out["invariant"]["ok"], out["invariant"]
            assert out["rounds"][-1]["mode"] == "in_place"
            assert out["approved"] + out["exhausted_in_place"] + out["remaining_pending"] == 300
            if strategy == "hybrid":
                assert [r["mode"] for r in out["rounds"]] == ["rounds", "in_place"]
    finally:
        cli("pool", "down", "--name", "ip", env=env)


def test_rule_judge_with_expected_answers(tmp_path: Path, env: dict[str, str]) -> None:
    src = dataset(tmp_path, 50)
    root = tmp_path / "run"
    try:
        out = cli(
            "run",
            str(src),
            str(root),
            "--name",
            "rule",
            "--engine",
            "simulated",
            "--prompt-template",
            "{{ question }}",
            "--max-rounds",
            "1",
            "--judge",
            '{"type": "expected_answer", "field": "answer", "match": "number"}',
            env=env,
        )
        # the SIMULATED engine answers hashes, never the right number: nothing approved, all pending
        assert out["approved"] == 0 and out["remaining_pending"] == 50
        assert out["invariant"]["ok"]
    finally:
        cli("pool", "down", "--name", "rule", env=env)


def test_run_on_a_static_pool_of_running_workers(tmp_path: Path, env: dict[str, str]) -> None:
    from tests.support.workers import TOKEN, start_worker

    w = start_worker(tmp_path)
    try:
        src = dataset(tmp_path, 40)
        out = cli(
            "run",
            str(src),
            str(tmp_path / "run"),
            "--worker-url",
            w.url,
            "--prompt-template",
            "{{ question }}",
            "--max-rounds",
            "2",
            env={**env, "BATCHINFER_WORKER_TOKEN": TOKEN},
        )
        assert out["invariant"]["ok"] and out["rounds"][0]["pending"] == 40
        assert w.http("GET", "/v1/stats").json()["jobs"]["succeeded"] >= 2
    finally:
        w.stop()


def test_rerun_reuses_finished_jobs_and_recomputes_changed_ones(tmp_path: Path, env: dict[str, str]) -> None:
    """Resume: the same settings on the same run root run no job twice; changed sampling makes the
    fingerprints differ, so those jobs run again (a stale result is never reused)."""
    src = dataset(tmp_path, 200)
    root = tmp_path / "run"

    def run(*extra: str) -> dict[str, Any]:
        return cli("run", str(src), str(root), "--name", "resume", "--engine", "simulated",
                   "--prompt-template", "{{ question }}", "--judge", '{"type": "llm"}', "--max-rounds", "2",
                   "--records-per-shard", "50", *extra, env=env)  # fmt: skip

    def manifests() -> dict[str, tuple[int, str]]:
        return {
            p.name: (p.stat().st_mtime_ns, json.loads(p.read_text())["fingerprint"])
            for p in (root / "round-00" / "jobs").glob("*.json")
        }

    try:
        first = run()
        before = manifests()
        assert len(before) == 8  # 4 shards x (infer, judge)
        again = run()
        assert manifests() == before and again["approved"] == first["approved"]
        run("--sampling", '{"max_tokens": 8}')
        after = manifests()
        infer = [name for name in before if name.endswith(".infer.json")]
        assert all(after[n][1] != before[n][1] and after[n][0] > before[n][0] for n in infer)
    finally:
        cli("pool", "down", "--name", "resume", env=env)
