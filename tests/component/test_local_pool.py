"""The local pool and ``batchinfer run``, as a user drives them: real CLI, real worker processes."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.pools import LocalPool, LocalPoolSpec
from airflow_batchinfer.storage import JsonlDir
from airflow_batchinfer.worker.announce import STARTUP_MARKS, read_announcement
from tests.support.local_pool import BIN, cli, dataset, env  # noqa: F401 (fixtures, used by name)

pytestmark = pytest.mark.slow


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
    assert LocalPool("t", state_dir=Path(env["BATCHINFER_CACHE"]) / "pools").endpoints() == []


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


def test_workers_announce_the_moment_they_serve_with_their_start_marks(tmp_path: Path) -> None:
    """The pool waits for each worker's announcement (not a poll of the worker): written once the
    engine is loaded and the socket listens, with the marks of its start in the order they happen."""
    pool = LocalPool("marks", state_dir=tmp_path / "pools")
    spec = LocalPoolSpec(engine="simulated", replicas=2, idle_ttl_s=None, allowed_prefixes=(str(tmp_path),))
    try:
        urls = pool.up(spec)
        workers = json.loads(pool.state_file.read_text())["generations"][spec.key()]["workers"]
        docs = [read_announcement(w["announce"]) for w in workers]
        assert sorted(d.url for d in docs if d) == sorted(urls)
        for w, doc in zip(workers, docs, strict=True):
            assert doc is not None and doc.pid == w["pid"]
            m = doc.startup
            assert set(m) == set(STARTUP_MARKS) and doc.started_at == m["announced"]
            assert m["imports"] <= m["app"] <= m["engine"] <= m["announced"]
            assert m["listening"] <= m["announced"]
    finally:
        pool.down()


def test_idle_ttl_lets_workers_exit(tmp_path: Path) -> None:
    pool = LocalPool("idle", state_dir=tmp_path / "pools")
    pool.up(LocalPoolSpec(engine="simulated", idle_ttl_s=1.0, allowed_prefixes=(str(tmp_path),)))
    deadline = time.monotonic() + 30
    while pool.endpoints() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pool.endpoints() == []


def alive(pid: int) -> bool:
    from airflow_batchinfer.pools.local_workers import alive as _alive

    return _alive(pid)


def wait_until(check: Any, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_a_leased_pool_outlives_its_idle_ttl(tmp_path: Path) -> None:
    """A review gate answered after the idle time: the run's lease keeps its workers; once released
    they exit after idle_ttl_s."""
    pool = LocalPool("leased", state_dir=tmp_path / "pools")
    spec = LocalPoolSpec(engine="simulated", idle_ttl_s=1.0, allowed_prefixes=(str(tmp_path),))
    try:
        urls = pool.up(spec, lease_id="dag/run-1")
        time.sleep(4)  # 4 x idle_ttl_s without a job
        assert pool.endpoints("dag/run-1") == urls
        assert pool.status()["leases"]["dag/run-1"]["replicas"] == 1
        assert pool.release("dag/run-1") == 1  # warm for idle_ttl_s after the release...
        wait_until(lambda: pool.endpoints() == [])  # ...then gone
    finally:
        pool.down()


def test_other_settings_never_stop_workers_another_run_leases(tmp_path: Path) -> None:
    pool = LocalPool("shared", state_dir=tmp_path / "pools")
    a = LocalPoolSpec(engine="simulated", concurrency=2, allowed_prefixes=(str(tmp_path),))
    b = LocalPoolSpec(engine="simulated", concurrency=3, replicas=2, allowed_prefixes=(str(tmp_path),))
    try:
        a_urls = pool.up(a, lease_id="dag/a")
        a_pids = [w["pid"] for w in pool.status()["workers"]]
        b_urls = pool.up(b, lease_id="dag/b")  # other settings: a second generation, side by side
        assert len(b_urls) == 2 and not set(a_urls) & set(b_urls)
        assert pool.endpoints("dag/a") == a_urls and sorted(pool.endpoints("dag/b")) == sorted(b_urls)
        assert pool.up(b, lease_id="dag/c") == b_urls  # the same settings share warm workers
        pool.up(dataclasses.replace(b, replicas=1), lease_id="dag/b")  # fewer wanted: nobody is stopped
        assert sorted(pool.endpoints("dag/b")) == sorted(b_urls)
        assert pool.release("dag/c", stop=True) == 2  # dag/b still holds them: nothing stops
        assert all(alive(pid) for pid in a_pids)  # all along
        pool.up(b, lease_id="dag/a")  # run a moves to b's settings: a lease holds one generation
        assert pool.status()["other_generations"] == []  # nobody holds a any more: replaced
        wait_until(lambda: not any(alive(pid) for pid in a_pids))
        assert sorted(pool.endpoints("dag/a")) == sorted(b_urls)
        pool.release("dag/a")
        assert pool.release("dag/b", stop=True) == 0  # the last holder stops them
    finally:
        pool.down()


def test_keep_restarts_workers_that_died_and_retakes_a_lapsed_lease(tmp_path: Path) -> None:
    clock = [time.time()]
    pool = LocalPool("heal", state_dir=tmp_path / "pools", clock=lambda: clock[0])
    spec = LocalPoolSpec(engine="simulated", replicas=2, idle_ttl_s=None, allowed_prefixes=(str(tmp_path),))
    try:
        urls = pool.up(spec, lease_id="dag/run", timeout_s=120)
        assert pool.keep("dag/run") is None  # nothing to repair
        victim = next(w for w in pool.status()["workers"] if w["url"] == urls[0])
        os.kill(victim["pid"], signal.SIGKILL)
        wait_until(lambda: urls[0] not in pool.endpoints("dag/run"))
        assert any(victim["id"] in p and "exited" in p for p in pool.problems())
        clock[0] += 2 * 24 * 3600  # and the lease lapsed meanwhile
        note = pool.keep("dag/run", ttl_s=60)
        assert note is not None and "lapsed" in note and "1 workers had exited" in note
        wait_until(lambda: len(pool.endpoints("dag/run")) == 2)
        assert pool.status()["leases"]["dag/run"]["expires_in_s"] == 60
    finally:
        pool.down()


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

    def manifests(rounds: str = "round-*") -> dict[str, tuple[int, str]]:
        return {
            str(p.relative_to(root)): (p.stat().st_mtime_ns, json.loads(p.read_text())["fingerprint"])
            for p in root.glob(f"{rounds}/jobs/*.json")
            if not p.name.endswith(".accepted.json")  # close's acceptance records, not job manifests
        }

    try:
        first = run()
        before = manifests()
        assert len(manifests("round-00")) == 4  # 4 shards x one infer_judge job
        assert len(before) > 4 and first["rounds"][1]["shards"] > 0  # round 1's jobs too
        again = run()  # every round's jobs reused, none run again
        assert manifests() == before and again["approved"] == first["approved"]
        run("--sampling", '{"max_tokens": 8}')
        after, changed = manifests(), manifests("round-00")
        assert all(after[n][1] != before[n][1] and after[n][0] > before[n][0] for n in changed)
    finally:
        cli("pool", "down", "--name", "resume", env=env)


def test_run_with_a_judge_pool_judges_there_shard_by_shard(tmp_path: Path, env: dict[str, str]) -> None:
    """``run --judge-pool``: each shard is inferred on the run's pool and judged on the judge's own
    pool (here a simulated judge that approves 90%, the run's pool 50%), a shard's judge starting
    once its own inference ends."""
    from airflow_batchinfer.engines.simulated import stable_fraction

    src = dataset(tmp_path, 120)
    root = tmp_path / "run"
    judges = ["--name", "judges", "--engine", "simulated", "--engine-arg", "approval_rate=0.9",
              "--engine-arg", "latency_base_s=0.05", "--allow-prefix", str(tmp_path)]  # fmt: skip
    cli("pool", "up", *judges, env=env)
    try:
        report = cli("run", str(src), str(root), "--name", "gen", "--engine", "simulated",
                     "--engine-arg", "latency_base_s=0.05", "--prompt-template", "{{ question }}",
                     "--judge", '{"type": "llm"}', "--judge-pool", "local://judges", "--max-rounds", "1",
                     "--records-per-shard", "20", env=env)  # fmt: skip
        assert report["invariant"]["ok"], report["invariant"]
        assert report["approved"] == sum(1 for i in range(120) if stable_fraction(f"q{i}", 1) < 0.9)
        plan = json.loads((root / "round-00" / "plan.json").read_text())
        assert plan["judge_engine"] and plan["judge_engine"] != plan["engine"]
        jobs = root / "round-00" / "jobs"
        infer = [json.loads(p.read_text()) for p in sorted(jobs.glob("*.infer.json"))]
        judge = [json.loads(p.read_text()) for p in sorted(jobs.glob("*.judge.json"))]
        assert len(infer) == len(judge) == 6
        assert {m["worker"] for m in infer}.isdisjoint(m["worker"] for m in judge)  # two pools
        assert all(m["engine"] == plan["judge_engine"] for m in judge)
        # each shard judged once its own inference ended (that the judge lanes pipeline with the
        # inference lanes, not wait for them all, is tests/unit/run/test_judge_lanes.py's: here the
        # simulated jobs end within a judge lane's poll)
        ended = {p.name.split(".")[0]: json.loads(p.read_text()) for p in jobs.glob("*.infer.json")}
        for p in jobs.glob("*.judge.json"):
            started = json.loads(p.read_text())["timings"]["started_at"]
            assert started >= ended[p.name.split(".")[0]]["timings"]["finished_at"], p.name
    finally:
        for name in ("gen", "judges"):
            cli("pool", "down", "--name", name, env=env)


def test_run_with_a_jury_whose_classifier_scores_on_the_judge_pool(
    tmp_path: Path, env: dict[str, str], tiny_classifier: str
) -> None:
    """``run --judge-pool`` with a pool serving the tiny classifier (transformers) and a jury of the
    run's own model (an llm member, judged on the run's pool as it answers: SIMULATED, approving 70%)
    and the classifier: every member's verdict in the rows, the round's disagreement in its summary,
    the rejected retried in round 1, every id accounted for."""
    src = dataset(tmp_path, 60)
    root = tmp_path / "run"
    cli("pool", "up", "--name", "scorers", "--engine", "transformers", "--model", tiny_classifier,
        "--allow-prefix", str(tmp_path), env=env)  # fmt: skip
    members = [{"type": "llm", "name": "critic"}, {"type": "classifier", "threshold": 0.3}]
    jury = {"type": "jury", "vote": "all", "judges": members}
    try:
        report = cli("run", str(src), str(root), "--name", "gen", "--engine", "simulated", "--engine-arg",
                     "approval_rate=0.7", "--prompt-template", "What is {{ question }}?", "--judge",
                     json.dumps(jury), "--judge-pool", "local://scorers", "--max-rounds", "2",
                     "--records-per-shard", "20", env=env)  # fmt: skip
        assert report["invariant"]["ok"], report["invariant"]
        r0, r1 = report["rounds"]
        assert r1["pending"] == r0["rejected"] > 0 and report["approved"] + report["remaining_pending"] == 60
        results = [r for f in JsonlDir(str(root / "results")).jsonl_files() for r in f.iter_records()]
        assert len(results) == report["approved"] > 0
        for row in results:
            critic, classifier = row["judgment"]["members"]
            assert critic["approved"] and classifier["approved"] and classifier["score"] >= 0.3
            assert row["judgment"]["score"] == 1.0 and "jury_verdicts" not in row
        rejected = [
            r for f in JsonlDir(str(root / "round-00" / "rejected")).jsonl_files() for r in f.iter_records()
        ]
        assert len(rejected) == r0["rejected"]
        assert all(not all(m["approved"] for m in r["judgment"]["members"]) for r in rejected)
        summary = json.loads((root / "round-00" / "summary.json").read_text())
        jury_stats = summary["jury"]
        split = sum(len({m["approved"] for m in r["judgment"]["members"]}) > 1 for r in rejected)
        assert jury_stats["voted"] == 60 and jury_stats["split"] == split
        assert set(jury_stats["members"]) == {"critic", "classifier"}
        plan = json.loads((root / "round-00" / "plan.json").read_text())
        assert plan["judge_engine"]["labels"] == ["rejected", "approved"]  # the judge pool scores
        assert "## Jury" in (root / "report" / "report.md").read_text()
    finally:
        for name in ("gen", "scorers"):
            cli("pool", "down", "--name", name, env=env)
