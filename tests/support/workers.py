"""Real worker processes for tests: :mod:`airflow_batchinfer.dev.workers` (the benchmarks start theirs
with it too), and :class:`LoadProbe`, what a starting worker answers before its engine is ready."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from airflow_batchinfer.dev.workers import TOKEN, WorkerProcess, start_worker

__all__ = ["TOKEN", "LoadProbe", "WorkerProcess", "start_worker"]


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
