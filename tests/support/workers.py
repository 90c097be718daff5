"""Real worker processes for tests: :mod:`airflow_batchinfer.dev.workers` (the benchmarks start theirs
with it too), :func:`run_job`, one job on one, and :class:`LoadProbe`, what a starting worker answers
before its engine is ready."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from airflow_batchinfer.dev.workers import TOKEN, WorkerProcess, start_worker
from airflow_batchinfer.rpc.models import JobKind, JobSpec
from airflow_batchinfer.state.docs import read_job_manifest
from airflow_batchinfer.state.tally import Tally

__all__ = ["TOKEN", "LoadProbe", "WorkerProcess", "run_job", "start_worker"]


def run_job(
    w: WorkerProcess, kind: JobKind, src: str, outputs: dict[str, str], params: dict[str, Any], name: str
) -> Tally:
    """One ``kind`` job (id ``name``) on ``w`` from ``src`` to ``outputs``, its manifest beside the
    first output: it must succeed (else the worker's log tail is shown); its manifest's counts."""
    manifest = str(Path(next(iter(outputs.values()))).parent / f"{name}.manifest.json")
    spec = JobSpec(
        job_id=name, kind=kind, input=src, outputs={**outputs, "manifest": manifest}, params=params
    )
    status = w.wait(w.submit(spec).job_id, timeout=900)
    assert status.state == "succeeded", f"{name}: {status.error}\n{w.log_tail()}"
    m = read_job_manifest(manifest)
    assert m is not None, f"{name}: succeeded without its manifest {manifest}"
    return m.counts


@dataclass
class LoadProbe:
    """Asks a worker that is starting on ``port`` for ``/v1/health`` (no token) and ``/v1/ready`` (with
    the token), every 0.2 s from :meth:`start` until it first answers: ``health`` and ``ready`` are those
    first answers (status, body), ``after_s`` how long after :meth:`start` they came. A worker whose
    engine loads for tens of seconds must answer meanwhile (a pool's readiness check tells "loading"
    from "dead" by it)."""

    port: int
    timeout_s: float = 60.0
    health: tuple[int, Any] | None = None
    ready: tuple[int, Any] | None = None
    after_s: float | None = None
    _thread: threading.Thread | None = field(default=None, repr=False)

    def start(self) -> LoadProbe:
        self._thread = threading.Thread(target=self._ask, daemon=True)
        self._thread.start()
        return self

    def _ask(self) -> None:
        url, t0 = f"http://127.0.0.1:{self.port}/v1", time.monotonic()
        while time.monotonic() - t0 < self.timeout_s:
            try:
                health = httpx.get(f"{url}/health", timeout=2)
                ready = httpx.get(f"{url}/ready", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=2)
            except httpx.TransportError:
                time.sleep(0.2)
                continue
            self.health = (health.status_code, health.json())
            self.ready = (ready.status_code, ready.json())
            self.after_s = time.monotonic() - t0
            return

    def join(self) -> LoadProbe:
        if self._thread is not None:
            self._thread.join(self.timeout_s + 10)
        return self
