"""Acceptance: a judge job whose regex is catastrophic for a backtracking engine (``(a+)+$`` over
``'a' * 30 + '!'``, 10,000 records) neither stalls the worker nor fails: ``/v1/health``, polled every
50 ms by another thread, keeps answering fast, and every record ends rejected.

On a backtracking ``re`` one record alone costs about 2**30 steps; the old worker ran the check on its
event loop, so ``/v1/health`` stopped answering at the first record. RE2 runs the same pattern in
linear time, and rule checks run off the event loop.

The bound on health latency (``HEALTH_BOUND_S``) is a responsiveness property, not a benchmark:
a probe answers in a few milliseconds; the bound leaves room for a loaded 2-core CI machine (the
event loop still writes and compresses output between chunks) while staying far below a stall.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.state.docs import read_job_manifest
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlFile
from tests.support.workers import start_worker

pytestmark = [pytest.mark.security, pytest.mark.slow]

RECORDS = 10_000
HEALTH_BOUND_S = 0.2
GIVE_UP_S = 2.0  # a health call this slow means the worker is stalled: stop waiting for the job


def test_catastrophic_regex_judge_keeps_health_fast_and_rejects_every_record(tmp_path: Path) -> None:
    layout = RunLayout(str(tmp_path / "run"))
    sid = "part-00000"
    inferred = JsonlFile(layout.inferred(0, sid))
    with inferred.writer_sync() as w:
        for i in range(RECORDS):
            w.write({"id": f"r{i}", "result": "a" * 30 + "!", "status": "ok", "attempts": 1, "round": 0})
    spec = JobSpec(
        job_id="r00-part-00000-judge",
        kind="judge",
        input=inferred.uri,
        outputs={
            "approved": layout.result(0, sid),
            "rejected": layout.rejected(0, sid),
            "manifest": layout.job_manifest(0, sid, "judge"),
        },
        params={
            "judge": {"type": "regex", "pattern": "(a+)+$", "must_match": True},
            "input_records": RECORDS,
        },
    )
    worker = start_worker(tmp_path, concurrency=2)
    latencies: list[float] = []
    stop = threading.Event()

    def poll_health() -> None:
        with httpx.Client(timeout=GIVE_UP_S) as client:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    ok = client.get(worker.url + "/v1/health").status_code == 200
                except httpx.HTTPError:  # timed out, or the worker is gone
                    ok = False
                latencies.append(time.monotonic() - started if ok else float("inf"))
                stop.wait(0.05)

    poller = threading.Thread(target=poll_health, daemon=True)
    try:
        poller.start()
        time.sleep(0.3)  # a few polls of the idle worker first
        headers = {"Authorization": f"Bearer {worker.token}"}
        with httpx.Client(timeout=GIVE_UP_S, headers=headers) as client:
            assert client.post(worker.url + "/v1/jobs", json=spec.model_dump()).status_code == 202
            deadline = time.monotonic() + 120
            state = "running"
            while state not in ("succeeded", "failed", "cancelled"):
                assert max(latencies) < GIVE_UP_S, "the worker stopped answering /v1/health"
                assert time.monotonic() < deadline, f"the job is still {state}"
                time.sleep(0.1)
                try:
                    status = client.get(f"{worker.url}/v1/jobs/{spec.job_id}").json()
                except httpx.TimeoutException:
                    pytest.fail("the worker stopped answering GET /v1/jobs")
                state = status["state"]
        time.sleep(0.2)
        stop.set()
        poller.join(timeout=5)
        assert state == "succeeded", status
        assert status["counts"] == {"outcomes": {"rejected": RECORDS}}
        assert len(latencies) >= 5
        worst = max(latencies)
        assert worst < HEALTH_BOUND_S, f"/v1/health took up to {worst * 1000:.0f} ms during the job"
        manifest = read_job_manifest(spec.outputs["manifest"])
        assert manifest is not None and manifest.counts.model_dump() == {"outcomes": {"rejected": RECORDS}}
        rejected = list(JsonlFile(layout.rejected(0, sid)).iter_records())
        assert len(rejected) == RECORDS
        assert rejected[0]["judgment"] == {"approved": False, "reason": "pattern not found"}
        assert not list(JsonlFile(layout.result(0, sid)).iter_records())
    finally:
        stop.set()
        worker.stop(sig=9)
