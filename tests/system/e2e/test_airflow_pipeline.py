"""The pipeline DAG on a real Airflow, driven through its REST API, asserting on storage.

The SIMULATED engine's judge approves record ``id`` on attempt ``a`` exactly when
``stable_fraction(id, a) < approval_rate``, so the test knows which round approves each id.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import xml.etree.ElementTree as ET
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.dev.local_airflow import LocalAirflow
from airflow_batchinfer.engines.simulated import stable_fraction
from airflow_batchinfer.pools import LocalPool
from airflow_batchinfer.run.report.render import plain_text
from airflow_batchinfer.storage.ranges import range_ids
from airflow_batchinfer.storage.shard_ref import parse_ref
from tests.support.e2e import (
    E2E_MAX_MAP_LENGTH,
    JUDGE_POOL_SLOTS,
    POOL_SLOTS,
    conf_for,
    rows,
    run,
)

pytestmark = [pytest.mark.airflow, pytest.mark.slow, pytest.mark.timeout(900)]
RATE = 0.5  # the e2e DAGs' simulated approval rate


def first_approval(rid: str, max_rounds: int, rate: float = RATE) -> int | None:
    """The round the simulated judge approves ``rid`` in (attempt = round + 1), or None."""
    return next((r for r in range(max_rounds) if stable_fraction(rid, r + 1) < rate), None)


def max_overlap(tis: list[dict[str, Any]], task_suffixes: tuple[str, ...]) -> int:
    """Most shard tasks in flight at one instant, from task-instance start and end timestamps."""
    spans = [
        (
            datetime.fromisoformat(ti["start_date"]).timestamp(),
            datetime.fromisoformat(ti["end_date"]).timestamp(),
        )
        for ti in tis
        if ti["task_id"].endswith(task_suffixes) and ti["start_date"] and ti["end_date"]
    ]
    return most_at_once(spans)


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """Most of ``spans`` (start, end) open at one instant (an end before a start at the same time)."""
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    now = best = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


def lane_docs(root: Path, r: int = 0) -> list[dict[str, Any]]:
    """Round ``r``'s lane documents (``round-NN/lanes/lane-NNNN.json``), by lane."""
    return [
        json.loads(p.read_text()) for p in sorted((root / f"round-{r:02d}" / "lanes").glob("lane-*.json"))
    ]


def lane_shards(root: Path, r: int = 0) -> list[dict[str, Any]]:
    """Every shard the round's lanes took, with its state and times (each lane's in its order)."""
    return [s for doc in lane_docs(root, r) for s in doc["shards"]]


def test_rounds_run_as_the_judge_dictates_and_the_pool_bounds_shards(airflow: LocalAirflow, e2e_root: Path):
    conf, ids = conf_for(e2e_root, "rounds", 120)
    state, root, report, tis = run(airflow, "e2e_rounds", conf)
    assert state == "success", report
    assert report["invariant"]["ok"], report["invariant"]
    assert report["stop_reason"] in ("max_rounds reached", "nothing pending")
    # every id exactly once, approved in the round the judge approves it, the rest still pending
    approved = rows(root / "results")
    assert Counter(r["id"] for r in approved).most_common(1)[0][1] == 1
    for r in approved:
        assert r["round"] == first_approval(r["id"], 3), r
    pending = {r["id"] for r in rows(root / "round-03" / "pending")} if report["remaining_pending"] else set()
    assert pending == {i for i in ids if first_approval(i, 3) is None}
    assert {r["id"] for r in approved} | pending == set(ids)
    assert [s["approved"] for s in report["rounds"]] == [
        sum(1 for i in ids if first_approval(i, 3) == k) for k in range(3)
    ]
    # 12 shards in round 0 on a pool of 4 slots: 4 lanes (mapped tasks), all in flight at once, each
    # running one shard at a time: never more than 4 shards in flight, and it got to 4
    lanes = [t for t in tis if t["task_id"] == "round_00.lanes"]
    assert sorted(t["map_index"] for t in lanes) == list(range(POOL_SLOTS))
    assert all(t["state"] == "success" for t in lanes) and max_overlap(tis, (".lanes",)) == POOL_SLOTS
    shards = lane_shards(root)  # every shard's state, since the grid shows one box per lane
    assert sorted(s["shard_id"] for s in shards) == [f"part-{i:05d}" for i in range(12)]
    assert {s["state"] for s in shards} == {"done"}
    assert most_at_once([(s["claimed_at"], s["ended_at"]) for s in shards]) == POOL_SLOTS
    assert (root / "report" / "report.md").read_text().startswith("# Batch inference report: ")
    assert ET.fromstring((root / "report" / "rounds.svg").read_bytes()).tag.endswith("svg")
    # A second DAG run of the same run_name runs no job again: on Airflow in tests/system/chaos
    # (test_a_second_run_with_the_same_run_name_is_refused_while_the_first_lives, once the first has
    # finished), every round's jobs in tests/component/test_local_pool.py (test_rerun_reuses_...).


def test_hybrid_switches_to_in_place_when_rounds_stop_paying_off(airflow: LocalAirflow, e2e_root: Path):
    # approving about half per round is below hybrid_min_shrink=0.9: round 1 switches to in place
    conf, ids = conf_for(e2e_root, "hybrid", 40, hybrid_min_shrink=0.9, max_attempts=4)
    state, root, report, _ = run(airflow, "e2e_hybrid", conf)
    assert state == "success", report
    modes = {p["slot"]: (p["mode"], p["switch_in_place"]) for p in report["plans"]}
    assert modes["round-00"] == ("rounds", False)
    assert modes["round-01"] == ("skip", True) and modes["tail"][0] == "in_place"
    assert report["invariant"]["ok"], report["invariant"]
    tail = [r for r in rows(root / "results") if r.get("round") != 0]
    assert tail and all(r["attempts"] >= 2 for r in tail)
    assert report["approved"] + report["exhausted_in_place"] == len(ids)


def test_review_gate_continue_then_accept(airflow: LocalAirflow, e2e_root: Path):
    conf, ids = conf_for(e2e_root, "review", 30)
    answers = iter(["Continue", "Accept remaining as they are"])
    seen: list[dict[str, Any]] = []

    def review(detail: dict[str, Any]) -> str:
        seen.append(detail)
        return next(answers)

    state, root, report, _ = run(airflow, "e2e_review", conf, on_review=review)
    assert state == "success", report
    assert [d["task_instance"]["task_id"] for d in seen] == ["round_01.plan", "round_02.plan"]
    body = plain_text(seen[0]["body"])  # paths and samples are markdown-escaped
    assert "Round 0 approved" in body and "Rejected samples" in body and "round-01/pending" in body
    plans = {p["slot"]: p for p in report["plans"]}
    assert plans["round-01"]["review"]["choice"] == "Continue" and plans["round-01"]["mode"] == "rounds"
    assert plans["round-02"]["review"]["choice"] == "Accept remaining as they are"
    assert report["status"] == "accepted_by_review" and not (root / "round-02" / "summary.json").exists()
    results = rows(root / "results")
    accepted = [r for r in results if r.get("accepted_by_review")]
    assert len(accepted) == report["accepted_by_review"] > 0
    assert sorted(r["id"] for r in results) == sorted(ids) and report["invariant"]["ok"]


def test_a_worker_killed_mid_round_loses_nothing(airflow: LocalAirflow, e2e_root: Path):
    # slow batches (3 s) so jobs are in flight when one worker is SIGKILLed
    conf, ids = conf_for(
        e2e_root, "killed", 60, engine_options={"approval_rate": RATE, "latency_base_s": 3.0},
        preflight_records=0, max_rounds=1,
    )  # fmt: skip
    pool = LocalPool("e2e", state_dir=e2e_root / "cache" / "pools")
    killed: list[int] = []

    def kill_one_when_busy() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not killed:
            status = pool.status()
            slow = (status.get("spec") or {}).get("engine_options", {}).get("latency_base_s") == 3.0
            for w in status["workers"] if slow else []:
                if w.get("slots_busy") and w["alive"]:
                    os.kill(int(w["pid"]), signal.SIGKILL)
                    killed.append(int(w["pid"]))
                    return
            time.sleep(0.5)

    killer = threading.Thread(target=kill_one_when_busy, daemon=True)
    killer.start()
    state, root, report, _tis = run(airflow, "e2e_rounds", conf)
    killer.join(5)
    assert killed, "no busy worker was seen"
    assert state == "success", report
    assert report["invariant"]["ok"] and report["failed_shards"] == []
    assert len(rows(root / "results")) + report["remaining_pending"] == len(ids)


def test_a_permanently_failing_shard_is_quarantined_and_fails_the_run(airflow: LocalAirflow, e2e_root: Path):
    conf, _ids = conf_for(e2e_root, "broken", 30, preflight_records=0, max_rounds=1)
    # a file where shard part-00001's job stages its outputs (a folder): that job fails on every try
    blocked = Path(conf["output_root"]) / "broken" / "round-00" / "staged" / "part-00001.infer_judge"
    blocked.parent.mkdir(parents=True)
    blocked.write_text("not a folder")
    state, root, report, tis = run(airflow, "e2e_rounds", conf)
    assert state == "failed"
    assert report["status"] == "failed_shards"
    [failed] = report["failed_shards"]
    assert failed["shard_id"] == "part-00001" and failed["phase"] == "infer_judge" and failed["records"] == 10
    record = json.loads((root / "round-00" / "failed" / "part-00001.json").read_text())
    assert record["error"] and "re-run" in record["remedy"]
    assert report["invariant"]["ok"], report["invariant"]  # the quarantined shard's ids are accounted for
    # round 0 reads the input in place: the quarantined shard is a byte range of it
    assert failed["uri"] == conf["input"] and record["range"] == failed["range"]
    shard = next(s for s in json.loads((root / "input" / "_manifest.json").read_text())["shards"]
                 if s["shard_id"] == "part-00001")  # fmt: skip
    shard_ids = set(range_ids(parse_ref(shard), id_field="id", assign_ids=False, storage_options=None))
    assert len(shard_ids) == 10
    assert not shard_ids & {r["id"] for r in rows(root / "results")}
    # its job failed on each of its 1 + job_retries tries inside its lane, which moved on and succeeded:
    # the lane document says which shard failed and why (the grid shows lanes, not shards)
    [entry] = [s for s in lane_shards(root) if s["shard_id"] == "part-00001"]
    assert entry["state"] == "failed" and entry["error"].startswith("infer_judge: "), entry
    lanes = [ti for ti in tis if ti["task_id"] == "round_00.lanes"]
    assert lanes and all(t["state"] == "success" and t["try_number"] == 1 for t in lanes)
    report_ti = next(ti for ti in tis if ti["task_id"] == "report")
    assert report_ti["state"] == "failed"
    assert asset_events(airflow, "e2e_rounds", report_run_id(airflow, "e2e_rounds", "broken")) == []


def test_a_round_of_forty_shards_runs_on_two_lanes_each_shard_once(airflow: LocalAirflow, e2e_root: Path):
    """More shards (one record each) than the deployment's max_map_length (32) and than its lanes: the
    pool has two slots, so round 0 maps two lane tasks, which take the shards until none is left."""
    conf, ids = conf_for(e2e_root, "lanes", 40)
    state, root, report, tis = run(airflow, "e2e_lanes", conf)
    assert state == "success", report
    assert report["invariant"]["ok"], report["invariant"]
    # byte ranges of about one record each (sizes estimated from the bytes): more than max_map_length
    planned = [s["shard_id"] for s in json.loads((root / "round-00" / "plan.json").read_text())["shards"]]
    assert report["rounds"][0]["shards"] == len(planned) > E2E_MAX_MAP_LENGTH
    lanes = [t for t in tis if t["task_id"] == "round_00.lanes"]
    assert sorted(t["map_index"] for t in lanes) == [0, 1] and all(t["state"] == "success" for t in lanes)
    docs = lane_docs(root)
    assert [(d["lane"], d["lanes"], d["finished"]) for d in docs] == [(0, 2, True), (1, 2, True)]
    shards = lane_shards(root)
    assert sorted(s["shard_id"] for s in shards) == sorted(planned)  # each once
    assert all(s["state"] == "done" for s in shards)
    assert all(len(d["shards"]) >= 5 for d in docs), [len(d["shards"]) for d in docs]  # both worked
    claims = sorted(p.stem for p in (root / "round-00" / "claims").glob("*.json"))
    assert claims == sorted(s["shard_id"] for s in shards)
    # every id exactly once: approved in results/ or pending for the next round
    approved = [r["id"] for r in rows(root / "results")]
    pending = [r["id"] for r in rows(root / "round-01" / "pending")]
    assert sorted(approved + pending) == sorted(ids)
    # each shard's start and end are in its lane's log
    log = airflow.task_log("e2e_lanes", report_run_id(airflow, "e2e_lanes", "lanes"), "round_00.lanes", 0)
    log += trigger_logs(airflow, "e2e_lanes", "lanes", "round_00.lanes", 0)
    first = docs[0]["shards"][0]["shard_id"]
    assert f"lane 0 of round-00: shard {first} (" in log, log[-3000:]
    assert f"lane 0 of round-00: shard {first} done in" in log, log[-3000:]
    # round 0's close found the run finished: it wrote the tail's plan and the report and skipped
    # the tail's tasks and the report task (none started); the pool teardown ran
    states = {t["task_id"]: t["state"] for t in tis if t["map_index"] == -1}
    folded = ("tail.plan", "tail.lanes", "tail.close", "report")
    assert {t: states[t] for t in folded} == dict.fromkeys(folded, "skipped"), states
    assert states["round_00.close"] == states["pool_teardown"] == "success", states
    assert json.loads((root / "tail" / "plan.json").read_text())["stop"] == "max_rounds reached"
    # the results asset's event, as the report task emits it, came through the close's alias
    run_id = report_run_id(airflow, "e2e_lanes", "lanes")
    [event] = asset_events(airflow, "e2e_lanes", run_id)
    assert event["source_task_id"] == "round_00.close" and event["uri"] == "x-batchinfer://e2e_lanes/results"
    assert event["extra"] == {
        "run_root": str(root),
        "results": str(root / "results"),
        "format": "jsonl",
        "status": report["status"],
        "stop_reason": "max_rounds reached",
        "rounds": 1,
        "approved": len(approved),
        "accepted_by_review": 0,
        "remaining_pending": len(pending),
    }, event
    # and the DAG scheduled on the asset ran, reading this run's results where the event said
    seen = e2e_root / "downstream" / f"{run_id}.json"
    deadline = time.monotonic() + 120
    while not seen.exists():
        runs = airflow.api("GET", "/dags/e2e_downstream/dagRuns")["dag_runs"]
        assert time.monotonic() < deadline, runs
        time.sleep(1)
    assert json.loads(seen.read_text()) == {"extra": event["extra"], "rows": len(approved)}


def test_a_redeployed_dag_file_does_not_reach_a_live_run(airflow: LocalAirflow, e2e_root: Path):
    """Issue 37 item 9: a run triggered without ``output_root``, whose DAG file's default changes once
    its first tasks ran: every later task keeps the run's root (the ``pin`` task's), the run succeeds
    there and nothing is written under the new default."""
    default = e2e_root / "redeploy" / "output_root"  # e2e_redeploy's default, read at each parse
    airflow.wait_for_dag("e2e_redeploy")
    conf, ids = conf_for(e2e_root, "redeploy", 30, preflight_records=0)
    del conf["output_root"]  # the DAG's default: e2e_root/runs, until the file says otherwise
    run_id = airflow.trigger("e2e_redeploy", conf)
    moved = e2e_root / "redeployed"
    try:
        deadline = time.monotonic() + 300
        while not any(
            t["task_id"] == "shard" and t["state"] == "success"
            for t in airflow.task_instances("e2e_redeploy", run_id)
        ):
            assert time.monotonic() < deadline, airflow.task_instances("e2e_redeploy", run_id)
            time.sleep(0.5)
        default.parent.mkdir(parents=True, exist_ok=True)
        default.write_text(str(moved))  # the redeployed file's output_root default
        state = airflow.wait_run("e2e_redeploy", run_id, timeout_s=600)
    finally:
        default.unlink(missing_ok=True)
    tis = {
        t["task_id"]: t["state"]
        for t in airflow.task_instances("e2e_redeploy", run_id)
        if t["map_index"] == -1
    }
    assert state == "success", tis
    root = e2e_root / "runs" / "redeploy"
    report = json.loads((root / "report" / "summary.json").read_text())
    assert report["invariant"]["ok"], report["invariant"]
    approved = [r["id"] for r in rows(root / "results")]
    assert approved and set(approved) <= set(ids)
    assert not moved.exists()  # no task looked for the run under the new default
    assert tis["round_00.close"] == tis["pool_teardown"] == "success", tis


def report_run_id(af: LocalAirflow, dag_id: str, run_name: str) -> str:
    """The id of the (last) DAG run of ``dag_id`` triggered with ``run_name``."""
    runs = af.api("GET", f"/dags/{dag_id}/dagRuns", params={"order_by": "-start_date", "limit": 50})[
        "dag_runs"
    ]
    return str(next(r["dag_run_id"] for r in runs if (r.get("conf") or {}).get("run_name") == run_name))


def asset_events(af: LocalAirflow, dag_id: str, run_id: str) -> list[dict[str, Any]]:
    """The asset events a DAG run emitted."""
    params = {"source_dag_id": dag_id, "source_run_id": run_id}
    return list(af.api("GET", "/assets/events", params=params)["asset_events"])


def trigger_logs(af: LocalAirflow, dag_id: str, run_name: str, task_id: str, map_index: int) -> str:
    """What a deferred task's trigger logged (the triggerer's file beside the task's own)."""
    run_id = report_run_id(af, dag_id, run_name)
    base = af.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
    base = base / f"map_index={map_index}"
    return "\n".join(p.read_text(errors="replace") for p in sorted(base.glob("*trigger*")))


def test_a_judge_with_its_own_pool_judges_each_shard_when_its_inference_ends(
    airflow: LocalAirflow, e2e_root: Path
):
    """``judge_pool``: the rounds run by lanes as without one; judge lanes beside them, in the judge's
    own Airflow pool (one per judge pool slot), judge each shard on the judge's own pool (another
    engine configuration) as soon as its inference ends; the judge pool's slots bound its jobs."""
    conf, ids = conf_for(e2e_root, "judgepool", 80, preflight_records=0, max_rounds=2)
    state, root, report, tis = run(airflow, "e2e_judge_pool", conf)
    assert state == "success", report
    assert report["invariant"]["ok"], report["invariant"]
    # approved as the judge pool's engine decides (it approves 80%; the run's pool would approve 50%)
    approved = rows(root / "results")
    assert sorted(r["id"] for r in approved) == sorted(
        i for i in ids if first_approval(i, 2, 0.8) is not None
    )
    assert all(r["round"] == first_approval(r["id"], 2, 0.8) for r in approved)
    # the judge jobs ran on the judge's pool: its engine is recorded in the plan and close kept them
    plan = json.loads((root / "round-00" / "plan.json").read_text())
    assert plan["judge_engine"] and plan["judge_engine"] != plan["engine"], plan
    judge_jobs = list((root / "round-00" / "jobs").glob("*.judge.json"))
    assert len(judge_jobs) == 8 and all(json.loads(p.read_text())["engine"] == plan["judge_engine"]
                                        for p in judge_jobs)  # fmt: skip
    # mapped lanes and judge lanes per round slot, each in its own Airflow pool: no task per shard
    assert {t["task_id"] for t in tis if ".shard." in t["task_id"]} == set()
    lanes = [t for t in tis if t["task_id"] == "round_00.lanes"]
    assert lanes and all(t["state"] == "success" and t["pool"] == "e2e" for t in lanes)
    judge_lanes = [t for t in tis if t["task_id"] == "round_00.judge_lanes"]
    assert len(judge_lanes) == JUDGE_POOL_SLOTS, judge_lanes
    assert all(t["state"] == "success" and t["pool"] == "e2e_judge" for t in judge_lanes)
    judge_docs = [json.loads(p.read_text()) for p in (root / "round-00" / "judge-lanes").glob("lane-*.json")]
    assert sorted(s["shard_id"] for d in judge_docs for s in d["shards"]) == sorted(
        p.name.removesuffix(".judge.json") for p in judge_jobs
    )  # each shard judged by a judge lane, once
    # each shard's judge started once its own inference ended, and never more judge jobs at once than
    # the judge pool's slots. (The judge lanes' tasks start seconds after the round's lanes: shards this
    # small may all be inferred by then. Judging while inference runs: tests/unit/run/test_judge_lanes.py.)
    timings = {
        p.name.removesuffix(".json"): json.loads(p.read_text())["timings"]
        for p in (root / "round-00" / "jobs").glob("*.json")
        if p.name.endswith((".infer.json", ".judge.json"))
    }
    shards = {k.rsplit(".", 1)[0] for k in timings}
    assert len(shards) == 8
    for sid in shards:
        assert timings[f"{sid}.judge"]["started_at"] >= timings[f"{sid}.infer"]["finished_at"]
    judged = [timings[f"{sid}.judge"] for sid in shards]
    assert most_at_once([(t["started_at"], t["finished_at"]) for t in judged]) <= JUDGE_POOL_SLOTS
