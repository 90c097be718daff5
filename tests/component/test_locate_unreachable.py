"""A resubmission never starts a second copy of a job while the worker that runs it is silent.

Real worker processes over real HTTP: the job runs on one worker, whose process is then paused
(SIGSTOP, a process this test started) for longer than a locate ask waits (LOCATE_TIMEOUT_S): it
accepts connections but answers nothing, as a worker behind a cut network or in a long GC pause
does. A second client (an Airflow retry) with an idle worker at hand must not start the job there;
once the paused worker answers again (SIGCONT), the retry follows the job where it runs, and exactly
one copy ran, on that worker."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from airflow_batchinfer.rpc.fingerprint import pin_input
from airflow_batchinfer.rpc.pool import LOCATE_TIMEOUT_S, PoolClient
from airflow_batchinfer.state.docs import JobManifest
from airflow_batchinfer.storage import JsonlFile
from tests.support.worker_failures import infer_spec, shard, wait_for
from tests.support.workers import TOKEN, WorkerProcess, start_worker

pytestmark = [pytest.mark.chaos, pytest.mark.slow]
PAUSED_S = 2.5 * LOCATE_TIMEOUT_S  # several asks time out while the worker is paused


def running(w: WorkerProcess, job_id: str) -> bool:
    r = w.http("GET", f"/v1/jobs/{job_id}")
    return r.status_code == 200 and r.json()["state"] == "running"


def jobs_seen(w: WorkerProcess) -> dict[str, int]:
    return dict(w.http("GET", "/v1/stats").json()["jobs"])


def test_a_retry_waits_for_a_silent_worker_instead_of_starting_a_second_copy(tmp_path: Path) -> None:
    layout, s = shard(tmp_path, 400)
    spec = infer_spec(layout, s, "silent-1", chunk_size=20)
    busy = start_worker(tmp_path, engine_args={"latency_base_s": 0.05}, concurrency=1)
    idle = start_worker(tmp_path, engine_args={"latency_base_s": 0.01}, concurrency=8)
    paused = False
    try:

        async def scenario() -> tuple[JobManifest, dict[str, int], bool]:
            first = PoolClient([busy.url], token=TOKEN, poll_interval_s=0.1)
            runner = asyncio.create_task(first.run(spec))  # the first try; its task then dies
            pinned = pin_input(spec, JsonlFile(spec.input).info())
            await asyncio.to_thread(wait_for, lambda: running(busy, pinned.job_id))
            runner.cancel()
            await first.aclose()
            nonlocal paused
            os.kill(busy.process.pid, signal.SIGSTOP)
            paused = True
            # The retry knows both workers; the idle one has the most free slots.
            retry = PoolClient(
                [idle.url, busy.url], token=TOKEN, poll_interval_s=0.2, unreachable_grace_s=300
            )
            try:
                again = asyncio.create_task(retry.run(spec))
                await asyncio.sleep(PAUSED_S)
                while_paused = jobs_seen(idle)  # nothing may have started there
                still_waiting = not again.done()
                os.kill(busy.process.pid, signal.SIGCONT)
                paused = False
                return await asyncio.wait_for(again, 120), while_paused, still_waiting
            finally:
                await retry.aclose()

        started = time.monotonic()
        manifest, while_paused, still_waiting = asyncio.run(scenario())
        assert while_paused == {} and still_waiting, "a second copy started while the first was silent"
        # The id/job invariant: exactly one copy ran, on the worker that had it (a copy started on
        # the idle worker once the silent one's status and stats asks timed out, before the fix).
        assert jobs_seen(idle) == {}, "a second copy of the job ran on the idle worker"
        assert jobs_seen(busy) == {"succeeded": 1}
        assert manifest.counts.model_dump() == {"generated": {"ok": 400}}
        assert manifest.worker.endswith(busy.url.rsplit(":", 1)[1])  # followed where it ran
        assert time.monotonic() - started >= PAUSED_S
    finally:
        if paused:
            os.kill(busy.process.pid, signal.SIGCONT)
        busy.stop()
        idle.stop()
