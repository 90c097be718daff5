"""Chaos around a review gate that gives the run's GPUs back (``gate_idle`` release, DAG
``chaos_gate``: the lease kept 2 s after the gate opens, workers that exit 1 s after their last
use): the pool is at zero while the gate waits and the answer re-warms it, deferred; another run's
lease keeps the workers; an answer that lands as the release happens; the triggerer killed while the
pool re-warms. Every run ends with every id once (the id invariant). Durations are measured and
reported in the assertion messages, never asserted."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.dev.local_airflow import LocalAirflow
from airflow_batchinfer.pools import LocalPool
from airflow_batchinfer.state.docs.usage import UsageEvent, read_usage
from airflow_batchinfer.state.layout import RunLayout
from tests.support.chaos import ti_by_id
from tests.support.chaos_run import Run, assert_invariant, start, succeed, workers

pytestmark = [pytest.mark.chaos, pytest.mark.airflow, pytest.mark.slow, pytest.mark.timeout(420)]
POOL = "chaos-gate"
GATE = "round_01.plan"
ENGINE = {"approval_rate": 0.5, "latency_base_s": 0.3}
ACCEPT = "Accept remaining as they are"  # the tail's gate: end the run


def alive_pids(pools_dir: Path) -> list[int]:
    """The pool's worker processes alive now (signal 0 to each pid the pool started)."""
    out = []
    for w in workers(pools_dir, POOL):
        try:
            os.kill(int(w["pid"]), 0)
        except ProcessLookupError:
            continue
        out.append(int(w["pid"]))
    return out


def usage(run: Run, kind: str) -> list[UsageEvent]:
    return [e for e in read_usage(RunLayout(run.root), run.so) if e.kind == kind and e.slot == "round-01"]


def check_round_01_ran(run: Run, report: dict[str, Any], keep_warm: float = 2) -> None:
    assert_invariant(run, report)
    plans = {p["slot"]: p for p in report["plans"]}
    assert plans["round-01"]["review"]["choice"] == "Continue" and plans["round-01"]["mode"] == "rounds"
    (opened,) = usage(run, "gate_open")
    # held at what the round's tail left (1 or 2 of the run's 2 workers), lapsing keep_warm after the opening
    assert opened.policy == "release" and 1 <= opened.replicas <= 2 and opened.lease_ttl_s == keep_warm


def test_a_released_gate_leaves_no_worker_alive_and_the_answer_rewarms_the_pool(
    chaos_airflow: LocalAirflow, chaos_root: Path, pools_dir: Path
) -> None:
    """Fault: nobody answers the gate for longer than gate_keep_warm_s + idle_ttl_s.
    System: the gate gives the run's lease back after 2 s; the pool's workers exit 1 s later (no
    other run holds them). The answer takes the lease again, starts the workers and waits for them on
    the triggerer; round 1 then runs.
    Operator: nothing; the gate's text says the GPUs are given back and what answering costs."""
    run = start(chaos_airflow, chaos_root, "chaos_gate", "gaterelease", 30, engine_options=ENGINE)
    seen: dict[str, Any] = {}

    def review(detail: dict[str, Any]) -> str | None:
        if detail["task_instance"]["task_id"] != GATE:
            return ACCEPT
        seen.setdefault("t0", time.monotonic())
        alive = alive_pids(pools_dir)
        if alive and time.monotonic() - seen["t0"] < 120:
            return None  # still warm: wait (after 120 s answer anyway; asserted below)
        seen["alive_at_answer"] = alive
        seen["answered"] = time.time()
        return "Continue"

    report = succeed(run, on_review=review)
    assert seen.get("alive_at_answer") == [], f"workers alive while the released gate waited: {seen}"
    check_round_01_ran(run, report)
    (warm,) = usage(run, "warm")  # the answer waited for the pool, deferred
    assert warm.requested_at is not None and warm.requested_at >= seen["answered"] - 5
    assert "waiting on the triggerer" in run.log(GATE), "the answer did not defer while the pool re-warmed"
    print(f"re-warm after the answer: {warm.at - warm.requested_at:.1f} s")  # measured, not asserted


def test_another_runs_lease_keeps_the_workers_through_a_released_gate(
    chaos_airflow: LocalAirflow, chaos_root: Path, pools_dir: Path
) -> None:
    """Fault: the gate gives its lease back while another run holds the same pool.
    System: the pool follows the leases: the other run's keeps every worker up; the answer finds
    them warm and shares them (no restart, no deferral).
    Operator: nothing."""
    run = start(chaos_airflow, chaos_root, "chaos_gate", "gateshared", 30, engine_options=ENGINE)
    pool = LocalPool(POOL, state_dir=pools_dir)
    pool.acquire("other_dag/other_run", 2, ttl_s=600)  # as another run's pool setup would
    seen: dict[str, Any] = {}
    try:

        def review(detail: dict[str, Any]) -> str | None:
            if detail["task_instance"]["task_id"] != GATE:
                return ACCEPT
            seen.setdefault("t0", time.monotonic())
            seen.setdefault("at_gate", alive_pids(pools_dir))
            if time.monotonic() - seen["t0"] < 2 + 1 + 5:  # keep_warm + idle_ttl + a margin
                return None
            seen["at_answer"] = alive_pids(pools_dir)
            return "Continue"

        report = succeed(run, on_review=review)
    finally:
        pool.release("other_dag/other_run")
    assert seen["at_gate"] and seen["at_answer"] == seen["at_gate"], seen
    check_round_01_ran(run, report)
    assert not usage(run, "warm"), "the answer waited for workers another run kept warm"


def test_a_gate_answered_as_its_lease_is_given_back(
    chaos_airflow: LocalAirflow, chaos_root: Path, pools_dir: Path
) -> None:
    """Fault: the answer comes the moment the gate's keep-warm ends: the lease lapses and the
    workers may be exiting while the answer takes the lease again.
    System: the answer re-takes the lease either way; a worker that exited is started again (by the
    answer, or by the round's lanes, which restart dead workers) and round 1 runs.
    Operator: nothing."""
    keep_warm = 12  # answers wait 10 s after a gate opens (Airflow 3.3.2, see wait_run)
    run = start(chaos_airflow, chaos_root, "chaos_gate", "gaterace", 30, engine_options=ENGINE,
                gate_keep_warm_s=keep_warm)  # fmt: skip
    seen: dict[str, Any] = {}

    def review(detail: dict[str, Any]) -> str | None:
        if detail["task_instance"]["task_id"] != GATE:
            return ACCEPT
        opened = usage(run, "gate_open")
        if not opened or time.time() < opened[0].at + keep_warm:
            return None
        seen["late_s"] = time.time() - (opened[0].at + keep_warm)
        seen["alive_at_answer"] = alive_pids(pools_dir)
        return "Continue"

    report = succeed(run, on_review=review)
    check_round_01_ran(run, report, keep_warm)
    print(f"answered {seen['late_s']:.1f} s after the release; workers alive then: {seen['alive_at_answer']}")


def test_the_triggerer_killed_while_the_answer_rewarms_the_pool(
    chaos_airflow: LocalAirflow, chaos_root: Path, pools_dir: Path
) -> None:
    """Fault: the triggerer is SIGKILLed (and started again 2 s later) while the gate's task waits,
    deferred, for the workers its answer started.
    System: the deferred task keeps its trigger in the database; the new triggerer re-creates it
    from its arguments and it fires once the workers are ready; the answer's plan was stored
    before the deferral, so round 1 runs as answered.
    Operator: nothing; restarting the triggerer is safe at any time."""
    af = chaos_airflow
    run = start(af, chaos_root, "chaos_gate", "gatetriggerer", 30, engine_options=ENGINE)
    seen: dict[str, Any] = {}

    def review(detail: dict[str, Any]) -> str | None:
        if detail["task_instance"]["task_id"] != GATE:
            return ACCEPT
        seen.setdefault("t0", time.monotonic())
        if alive_pids(pools_dir) and time.monotonic() - seen["t0"] < 120:
            return None
        seen["answered"] = True
        return "Continue"

    def watch(tis: list[dict[str, Any]]) -> None:
        gate = ti_by_id(tis, GATE)
        if not seen.get("answered") or "restart" in seen or gate is None or gate["state"] != "deferred":
            return
        if "waiting on the triggerer" in run.log(GATE):  # deferred on the re-warm, not on the gate
            seen["restart"] = af.restart("triggerer", signal.SIGKILL, down_s=2.0)

    report = succeed(run, on_review=review, on_poll=watch)
    assert "restart" in seen, f"the answer's re-warm was not caught deferred: {seen}"
    check_round_01_ran(run, report)
    assert len(usage(run, "warm")) == 1
