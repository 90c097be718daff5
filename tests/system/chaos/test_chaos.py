"""Chaos: one fault injected into a real run on a real local Airflow, real worker processes and a real
S3 server; every test ends with the id invariant (each input id in exactly one of results/, the
final pending set, a quarantined shard, the in-place exhausted rows or rejects/ — 0 lost, 0
duplicated; from ``report/summary.json`` and counted again from the files) and a successful DAG
run, directly or after the documented remedy (re-run the DAG run: clear it through the REST API).

The SIMULATED engine stands in for a model: ``latency_base_s`` sets how long a batch (here a whole
shard of 10 records) takes, so a fault lands while jobs are in flight.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.dev.local_airflow import LocalAirflow
from airflow_batchinfer.pools import LocalPool
from airflow_batchinfer.rpc.client import SyncWorkerClient
from airflow_batchinfer.state.docs.lanes import read_lane
from airflow_batchinfer.state.layout import RunLayout
from tests.support.chaos import (
    FAILURE_TIMEOUT_S,
    SmallDisk,
    kill_pids,
    lane_job,
    partial_files,
    ran,
    shard_tis,
    ti_by_id,
    wait_until,
)
from tests.support.chaos_run import Run, assert_invariant, start, succeed, workers
from tests.support.seaweedfs import S3Server

pytestmark = [pytest.mark.chaos, pytest.mark.airflow, pytest.mark.slow, pytest.mark.timeout(420)]
# One round of 6 s jobs (a batch is a shard), so a fault lands while the lanes run them; a rule judge
# (approves ~60%: answers ending in a digit) takes no engine time.
# The same engine settings everywhere keep the shared pool warm between tests.
ENGINE = {"approval_rate": 0.6, "latency_base_s": 6.0}
SLOW: dict[str, Any] = {
    "max_rounds": 1,
    "engine_options": ENGINE,
    "judge": {"type": "regex", "pattern": "[0-9]$", "must_match": True},
}
S3_ENGINE = {"approval_rate": 0.5, "latency_base_s": 2.5}
# judged on the engine too, 15 s a batch (~30 s a job, on a pool of its own): a run that outlasts
# whatever a test does meanwhile (restarts, a second run), however busy the machine
SLOWER: dict[str, Any] = {**SLOW, "judge": {"type": "llm"}, "worker_pool": "local://chaos-triggerer",
                          "engine_options": {**ENGINE, "latency_base_s": 15.0}}  # fmt: skip


def worker_jobs(pools_dir: Path, name: str) -> dict[str, dict[str, int]]:
    """Per worker URL: its job states (/v1/stats) — every job id a worker ever took counts once."""
    pool = LocalPool(name, state_dir=pools_dir)
    out = {}
    for w in pool.status()["workers"]:
        if w.get("alive") and w.get("url"):
            with SyncWorkerClient(w["url"], token=pool.token(), timeout=10) as client:
                out[w["url"]] = dict(client.stats().jobs)
    return out


def job_manifests(run: Run) -> list[str]:
    """The completion manifests of the run's shard jobs (``round-NN/jobs/<shard>.<kind>.json``)."""
    from airflow_batchinfer.storage.location import resolve

    loc = resolve(run.root, run.so)
    found = loc.fs.glob(f"{loc.path}/round-*/jobs/*.json")
    return sorted(p for p in found if re.search(r"/part-\d+\.(infer_judge|infer|judge|in_place)\.json$", p))


# ----------------------------------------------------------------------------------- 1. triggerer
def test_triggerer_restarted_twice_mid_round(chaos_airflow: LocalAirflow, chaos_root: Path) -> None:
    """Fault: the triggerer is stopped while lane tasks are deferred on it (their lanes run there) —
    first with SIGTERM and started again at once, then, once the new one has taken the triggers over,
    with SIGKILL and started again 2 s later.
    System: deferred tasks keep their state in the database; the new triggerer takes the triggers
    over (after a SIGKILL, once the dead one's heartbeat is older than the health threshold) and each
    lane starts again where its document says: it takes its running shard back and follows the job
    on its worker, which never stopped. Nothing is resubmitted or lost.
    Operator: nothing to do; restarting the triggerer is safe at any time."""
    af = chaos_airflow
    run = start(af, chaos_root, "chaos_rounds", "triggerer", 40, **SLOWER)  # deferred through both restarts
    restarts = []
    for sig, down_s in ((signal.SIGTERM, 0.0), (signal.SIGKILL, 2.0)):
        run.wait_for_tis("deferred lane tasks", lambda tis: shard_tis(tis, "deferred"))
        old, new = af.restart("triggerer", sig, down_s=down_s)
        restarts.append((signal.Signals(sig).name, old, new))
        time.sleep(3.0)  # the new triggerer takes the deferred tasks' triggers over before it is killed
    report = succeed(run)
    assert_invariant(run, report)
    assert report["rounds"][0]["shards"] == 4 and not report["failed_shards"]
    assert len(restarts) == 2 and restarts[0][2] == restarts[1][1]  # the restarted one was killed again


# ----------------------------------------------------------------------------------- 2. scheduler
def test_scheduler_killed_and_restarted_mid_round(chaos_airflow: LocalAirflow, chaos_root: Path) -> None:
    """Fault: the scheduler's whole process group is SIGKILLed mid-round (the scheduler, its
    LocalExecutor workers and the task processes they run: a lost scheduler host), and a new
    scheduler starts 3 s later.
    System: deferred shard tasks live on in the triggerer; the new scheduler marks the dead one's job
    failed once its heartbeat is older than ``scheduler_health_check_threshold`` and resets the task
    instances it had queued or running, which run again (a shard task that runs again finds its job
    finished or running under the same job id); the run finishes with every id accounted for.
    Operator: start the scheduler again; nothing else."""
    af = chaos_airflow
    run = start(af, chaos_root, "chaos_rounds", "scheduler", 40, **SLOW)
    run.wait_for_tis("shard tasks in flight", lambda tis: shard_tis(tis, "deferred", "running"))
    af.restart("scheduler", signal.SIGKILL, down_s=3.0, group=True)
    report = succeed(run)
    assert_invariant(run, report)
    assert not report["failed_shards"]


# ------------------------------------------------------------------------------- 3. task process
def test_task_process_killed_becomes_a_zombie_and_is_retried(
    chaos_airflow: LocalAirflow, chaos_root: Path, pools_dir: Path
) -> None:
    """Fault: the process running a lane task instance (the task runner titled ``airflow worker --
    <ti id>`` and its supervisor, which heartbeats for it) is SIGKILLed while its lane runs in the
    task (``in_task``) and the lane's job runs, as if its host died.
    System: nobody reports the task's end; the scheduler sees no heartbeat for
    ``task_instance_heartbeat_timeout`` (10 s here), fails the try and Airflow retries it. The job
    ran on, untouched, on its worker; the retry's lane takes its shard back (its document says it was
    running) and finds the job (finished: its manifest with the same fingerprint, so it is not run
    again; or still running: followed) and the run completes.
    Operator: nothing; size ``task_instance_heartbeat_timeout`` to how fast you want this noticed."""
    af = chaos_airflow
    # three shards a lane: the plan task starts each lane's first job, which may end before a busy
    # machine starts the lane's task; its next shards run while the task runs
    run = start(af, chaos_root, "chaos_inline", "taskkill", 120, **SLOW)
    victim, procs = _running_job_task(run, pools_dir, "chaos")
    shard = _running_shard(run, victim["map_index"])
    t_kill = time.monotonic()
    assert kill_pids([procs["task"], procs["supervisor"]]) == [procs["task"], procs["supervisor"]]
    retried = wait_until(
        lambda: (
            (t := ti_by_id(run.tis(), victim["task_id"], victim["map_index"]))
            and t["try_number"] > procs["try_number"]
            and t
        ),
        FAILURE_TIMEOUT_S * 6,
        "the zombie to be retried",
    )
    detected_s = time.monotonic() - t_kill
    report = succeed(run)
    assert_invariant(run, report)
    assert not report["failed_shards"] and retried["try_number"] == procs["try_number"] + 1
    assert detected_s < FAILURE_TIMEOUT_S * 4, detected_s
    retry_log = run.log(victim["task_id"], victim["map_index"]).split("Worker startup parse complete")[-1]
    # the lane took its running shard back: the same job, finished (its manifest reused) or followed
    assert f"taking back ['{shard}']" in retry_log, retry_log[-3000:]


def _running_job_task(run: Run, pools_dir: Path, pool: str) -> tuple[dict[str, Any], dict[str, int]]:
    """A round-0 lane task instance running in its process (``in_task``) while its lane's job runs on
    a worker, and its processes."""

    def find() -> tuple[dict[str, Any], dict[str, int]] | None:
        tis = run.tis()
        if run.state() in ("success", "failed"):
            raise AssertionError(
                f"the run ended: {[(t['task_id'], t['map_index'], t['state']) for t in tis]}"
            )
        for ti in shard_tis(tis, "running"):
            if (
                ti["task_id"] == "round_00.lanes"
                and job_state(run, pools_dir, pool, ti["map_index"]) == "running"
            ):
                procs = _processes(run.af, run, ti)
                if procs is not None:
                    return ti, procs
        return None

    found = wait_until(find, 90, "a lane task running in its process with its lane's job running")
    return found[0], found[1]


def _running_shard(run: Run, lane: int) -> str:
    doc = read_lane(RunLayout(run.root), 0, lane, run.so)
    assert doc is not None
    return next(s.shard_id for s in doc.shards if s.state == "running")


def job_state(run: Run, pools_dir: Path, pool: str, lane: int) -> str | None:
    """The state of the job round 0's lane ``lane`` runs now on the pool's workers, if any has it."""
    spec = lane_job(run.root, lane, run.so)
    if spec is None:
        return None
    local = LocalPool(pool, state_dir=pools_dir)
    for w in local.status()["workers"]:
        if w.get("alive") and w.get("url"):
            with (
                contextlib.suppress(Exception),
                SyncWorkerClient(w["url"], token=local.token(), timeout=5) as c,
            ):
                return str(c.status(spec.job_id).state)
    return None


def _processes(af: LocalAirflow, run: Run, ti: dict[str, Any]) -> dict[str, int] | None:
    try:
        return af.task_processes(run.dag_id, run.run_id, ti["task_id"], ti["map_index"])
    except LookupError:
        return None


# --------------------------------------------------------------------------- 4. worker SIGKILL, S3
@pytest.mark.s3
def test_worker_killed_during_in_place_jobs_on_s3(
    chaos_airflow: LocalAirflow, chaos_root: Path, chaos_s3: S3Server, pools_dir: Path
) -> None:
    """Fault: a worker process is SIGKILLed while it runs in-place jobs whose outputs and
    checkpoints are on the S3 server.
    System: the triggers polling it see it unreachable for ``lost_grace_s`` and report the job lost;
    the shard task finds no completion manifest and resubmits the same job id to a live worker,
    which resumes each sample after its last checkpointed attempt (on S3). Outputs commit atomically,
    so the killed worker left nothing visible; no id is lost or doubled.
    Operator: nothing; a local pool replaces a dead worker on the next run's pool setup."""
    af = chaos_airflow
    run = start(af, chaos_root, "chaos_s3", "workerkill", 40, s3=chaos_s3, strategy="in_place",
                max_attempts=4, engine_options=S3_ENGINE)  # fmt: skip
    run.wait_for_tis("in-place tasks in flight", lambda tis: shard_tis(tis, "running", "deferred"))
    busy = wait_until(
        lambda: [w for w in workers(pools_dir, "chaos-s3") if w.get("alive") and w.get("slots_busy")],
        60,
        "a busy worker",
    )
    time.sleep(2.0)  # let it checkpoint some attempts first
    assert kill_pids([int(busy[0]["pid"])]) == [int(busy[0]["pid"])]
    report = succeed(run)
    assert_invariant(run, report)
    assert report["strategy"] == "in_place" and not report["failed_shards"]
    assert report["approved"] + report["exhausted_in_place"] == len(run.ids) - 1
    results = [r for f in _jsonl(run, "results") for r in f.iter_records()]
    assert results and all(1 <= r["attempts"] <= 4 for r in results)


def _jsonl(run: Run, sub: str) -> list[Any]:
    from airflow_batchinfer.storage import JsonlDir

    return JsonlDir(f"{run.root}/{sub}", storage_options=run.so).jsonl_files()


# ------------------------------------------------------------------------------------ 5. S3 outage
@pytest.mark.s3
def test_s3_server_down_20s_mid_round(
    chaos_airflow: LocalAirflow, chaos_root: Path, chaos_s3: S3Server
) -> None:
    """Fault: the S3 server holding the run root stops for 20 s while round 0's jobs run, then
    starts again on the same port with the same data.
    System: worker jobs that read or write meanwhile fail, as do shard tasks reading manifests;
    each failed try is retried by Airflow (3 retries, 8 s apart, outlast the outage) and
    resubmits its job under the same id; files commit atomically, so nothing half-written is ever
    visible. If a shard still exhausted its retries, the round's close quarantines it and the run
    fails naming it.
    Operator: nothing, or — if the run failed — re-run it once S3 is back (clear the DAG run;
    finished shards are reused)."""
    af = chaos_airflow
    run = start(af, chaos_root, "chaos_s3", "s3outage", 40, s3=chaos_s3,
                max_rounds=1, engine_options=S3_ENGINE)  # fmt: skip
    run.wait_for_tis("shard tasks in flight", lambda tis: shard_tis(tis, "running", "deferred"))
    down = chaos_s3.outage(20.0)
    assert down >= 20.0
    report = succeed(run, max_remedies=1)
    assert_invariant(run, report)
    assert not report["failed_shards"]
    retried = [t for t in shard_tis(run.tis()) if t["try_number"] > 1]
    assert retried or run.remedies, "the outage touched no shard task: it did not land mid-round"


# ------------------------------------------------------------------------------------- 6. full disk
def test_full_disk_fails_cleanly_then_a_rerun_succeeds(chaos_airflow: LocalAirflow, chaos_root: Path) -> None:
    """Fault: the disk under the run root (an 8 MiB tmpfs) fills up while round 0's jobs run.
    System: every write that needs space fails with ENOSPC; the shard jobs fail, Airflow retries
    them, they fail again and the round's shards are quarantined or the round's close fails; the run
    fails with an error naming the path it could not write. Files commit atomically: no partial
    shard, no temporary file is left behind.
    Operator: free space under the output root, then re-run the DAG run (clear it): sharding and
    finished jobs are reused, and the run completes."""
    af = chaos_airflow
    disk = SmallDisk(chaos_root / "runs" / "diskfull", size="8m")
    try:
        disk.mount()
    except PermissionError as exc:
        pytest.skip(f"cannot mount a small tmpfs here ({exc}); this test needs CAP_SYS_ADMIN")
    try:
        run = start(af, chaos_root, "chaos_disk", "diskfull", 40, **SLOW)
        run.wait_for_tis("deferred lane tasks", lambda tis: shard_tis(tis, "deferred"))
        disk.fill()
        assert disk.free_bytes() == 0
        assert run.wait() == "failed"
        errors = "\n".join(
            run.log(t["task_id"], t["map_index"])
            for t in run.tis()
            if t["state"] in ("failed", "up_for_retry")
        )
        assert "No space left on device" in errors
        named = [line for line in errors.splitlines() if "No space left" in line and run.root in line]
        assert partial_files(run.root) == [], partial_files(run.root)
        disk.free()
        report = succeed(run, max_remedies=1)
        assert run.remedies == 1
        assert_invariant(run, report)
        assert not report["failed_shards"]
        assert named, f"no error names the path it could not write (under {run.root})"
    finally:
        disk.free()
        disk.unmount()


# ---------------------------------------------------------------------------------- 7. review gate
def test_review_gate_answered_after_three_idle_ttls_keeps_the_pool(
    chaos_airflow: LocalAirflow, chaos_root: Path, pools_dir: Path
) -> None:
    """Fault: a review gate stays open for 3 x ``idle_ttl_s`` (the pool's workers exit after
    ``idle_ttl_s`` = 3 s without jobs) before a person answers Continue.
    System: with ``gate_idle`` keep the run holds its lease on its local pool while the gate waits,
    so its workers do not idle out while it waits for a person; the next round runs on the same
    warm workers (``release``, the default on a local pool, is test_gate_idle.py's).
    Operator: answer the gate when convenient; ``idle_ttl_s`` only applies once no run holds the
    pool."""
    af = chaos_airflow
    idle_ttl = 3
    run = start(af, chaos_root, "chaos_review", "review", 30, idle_ttl_s=idle_ttl,
                engine_options={"approval_rate": 0.5, "latency_base_s": 0.3})  # fmt: skip
    seen: dict[str, Any] = {}

    def watch(tis: list[dict[str, Any]]) -> None:
        gate = ti_by_id(tis, "round_01.plan")
        if "gate_t" not in seen and gate is not None and gate["state"] == "awaiting_input":
            seen["gate_t"] = time.monotonic()
            seen["at_gate"] = {w["pid"]: w["alive"] for w in workers(pools_dir, "chaos-review")}

    def review(detail: dict[str, Any]) -> str | None:
        if detail["task_instance"]["task_id"] != "round_01.plan":
            return "Accept remaining as they are"  # the tail's gate
        seen.setdefault("gate_t", time.monotonic())
        seen.setdefault("at_gate", {w["pid"]: w["alive"] for w in workers(pools_dir, "chaos-review")})
        if time.monotonic() - seen["gate_t"] < 3 * idle_ttl + 1:
            return None  # keep the gate open for 3 idle TTLs
        seen["at_answer"] = {w["pid"]: w["alive"] for w in workers(pools_dir, "chaos-review")}
        seen["answer_t"] = time.monotonic()
        return "Continue"

    state = run.wait(on_review=review, on_poll=watch)
    assert seen.get("at_gate") and all(seen["at_gate"].values()), seen
    assert seen["answer_t"] - seen["gate_t"] >= 3 * idle_ttl
    assert seen.get("at_answer") == seen["at_gate"], (
        f"the run's workers left while it waited for review (after >= {3 * idle_ttl} s): at the gate "
        f"{seen['at_gate']}, at the answer {seen.get('at_answer')}"
    )
    assert state == "success", [(t["task_id"], t["state"]) for t in run.tis() if t["state"] == "failed"]
    report = run.report()
    assert_invariant(run, report)
    plans = {p["slot"]: p for p in report["plans"]}
    assert plans["round-01"]["review"]["choice"] == "Continue" and plans["round-01"]["mode"] == "rounds"


# -------------------------------------------------------------------------- 8. retry follows the job
def test_a_retry_follows_the_job_its_killed_first_try_left_running(
    chaos_airflow: LocalAirflow, chaos_root: Path, pools_dir: Path
) -> None:
    """Fault: the first try of a lane task running its lane in the task is killed (task process and
    supervisor, SIGKILL) while its job runs on a slow engine (30 s per batch); Airflow retries the
    task while the job still runs.
    System: the retry's lane takes its running shard back and, before submitting, asks the pool's
    workers whether one already runs the job id and follows it there, so the job runs once; a
    second copy on another worker would waste a slot and race the first on the same outputs.
    Operator: nothing."""
    af = chaos_airflow
    pool = "chaos-retry"  # fresh workers: their job counts are this run's
    run = start(af, chaos_root, "chaos_inline", "retryfollow", 10, max_rounds=1, worker_pool=f"local://{pool}",
                judge={"type": "length", "min_chars": 1},
                engine_options={"approval_rate": 0.6, "latency_base_s": 30.0})  # fmt: skip
    # The job counts are read from the live workers: a second lease keeps both through the round's
    # tail, which would otherwise stop an idle one (and its count with it).
    keeper = LocalPool(pool, state_dir=pools_dir)
    keeper.acquire("chaos/keep-counts", 2, ttl_s=3600)
    try:
        victim, procs = _running_job_task(run, pools_dir, pool)
        kill_pids([procs["task"], procs["supervisor"]])
        seen: list[tuple[float, int, str]] = []  # the victim's (seconds since the kill, try, state) changes
        killed_at = time.monotonic()

        def retried() -> dict[str, Any] | None:
            t = ti_by_id(run.tis(), victim["task_id"], victim["map_index"])
            if t and (not seen or seen[-1][1:] != (t["try_number"], t["state"])):
                seen.append((round(time.monotonic() - killed_at, 1), t["try_number"], t["state"]))
            if (
                t
                and t["try_number"] > procs["try_number"]
                and t["state"] in ("running", "deferred", "success")
            ):
                return t
            return None

        try:  # usually ~12 s: a heartbeat timeout, a retry delay and a start
            retry = wait_until(retried, FAILURE_TIMEOUT_S * 6, "the retry to start")
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; the killed task instance's (s, try, state): {seen}") from None
        running_at_retry = worker_jobs(pools_dir, pool)
        report = succeed(run)
        assert_invariant(run, report)
        assert retry["try_number"] == procs["try_number"] + 1
        assert any(j.get("running") for j in running_at_retry.values()), (
            f"the first try's job had already finished when the retry started: {running_at_retry}"
        )
        jobs = worker_jobs(pools_dir, pool)
        taken = sum(sum(states.values()) for states in jobs.values())
        assert taken == len(job_manifests(run)), (
            f"{taken} jobs taken by the workers for {len(job_manifests(run))} shard jobs: the retry started "
            f"a second copy instead of following the running one ({jobs})"
        )
    finally:
        keeper.release("chaos/keep-counts")


# -------------------------------------------------------------------------------- 9. run ownership
def test_a_second_run_with_the_same_run_name_is_refused_while_the_first_lives(
    chaos_airflow: LocalAirflow, chaos_root: Path
) -> None:
    """Fault: a second DAG run is triggered with the run_name of a run that is still running.
    System: the second run's first task finds the run root owned (``owner.json``) by a live DAG run
    and fails with the reason and the remedy, before writing anything; none of its other tasks
    touches the run root, so the first run goes on alone. Once the first has finished, clearing the
    second takes the root over and resumes there (nothing is run twice).
    Operator: pick another run_name, or wait for (or fail) the other run, then clear this one."""
    af = chaos_airflow
    first = start(af, chaos_root, "chaos_rounds", "owner", 40, **SLOWER)  # still running at the refusal
    first.wait_for_tis("the first run's shard tasks", lambda tis: shard_tis(tis, "deferred", "running"))
    owner_before = Path(first.root, "owner.json").read_bytes()
    conf = af.api("GET", f"/dags/chaos_rounds/dagRuns/{first.run_id}")["conf"]
    second = Run(af, "chaos_rounds", af.trigger("chaos_rounds", conf), first.root, first.ids)

    def refused() -> list[dict[str, Any]]:
        shard = ti_by_id(second.tis(), "shard")
        return [shard] if shard is not None and shard["state"] == "failed" else []

    # the refusal happens while the first run lives (checked then: on a busy machine the second
    # run's later tasks may take longer than the first run has left)
    wait_until(refused, 300, "the second run's shard task refused", poll_s=0.5)
    assert first.state() == "running", "the first run should still be running: make its jobs slower"
    assert second.wait() == "failed"
    tis = second.tis()
    shard = ti_by_id(tis, "shard")
    assert shard is not None and shard["state"] == "failed" and shard["try_number"] == 1  # no retry
    log = second.log("shard")
    assert f"belongs to DAG run chaos_rounds/{first.run_id}, which is running" in log
    assert "another run_name" in log
    # The all_done tasks (close, report) start anyway; each must stop at the ownership check before
    # it reads or writes anything (the pin and pool tasks do not touch the run root).
    allowed = ("pin", "shard", "pool_setup", "pool_teardown")
    started = [t for t in tis if ran(t) and t["task_id"] not in allowed]
    touched = sorted(
        t["task_id"]
        for t in started
        if t["state"] != "failed" or "nothing here may touch it" not in second.log(t["task_id"])
    )
    assert Path(first.root, "owner.json").read_bytes() == owner_before

    report = succeed(first)
    assert_invariant(first, report)
    manifests = {p: Path(p).stat().st_mtime_ns for p in job_manifests(first)}
    second.af.clear_run(second.dag_id, second.run_id)  # the first has finished: take the root over
    again = succeed(second)
    owner = json.loads(Path(first.root, "owner.json").read_text())
    assert (owner["run_id"], owner["previous"]["run_id"]) == (second.run_id, first.run_id)
    assert again["approved"] == report["approved"]
    assert {p: Path(p).stat().st_mtime_ns for p in job_manifests(first)} == manifests  # nothing re-ran
    assert_invariant(second, again)
    assert touched == [], f"tasks of the refused run went past the ownership check: {touched}"
