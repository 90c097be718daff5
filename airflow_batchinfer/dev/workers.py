"""Real worker processes for tests and benchmarks: ``batchinfer worker serve`` on 127.0.0.1, real HTTP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from airflow_batchinfer.rpc.client import SyncWorkerClient
from airflow_batchinfer.rpc.models import JobSpec, JobStatus

TOKEN = "test-token-" + "x" * 24


@dataclass
class WorkerProcess:
    url: str
    token: str
    process: subprocess.Popen[bytes]
    log: Path

    def client(self, token: str | None = None) -> SyncWorkerClient:
        return SyncWorkerClient(self.url, token=token or self.token)

    def http(self, method: str, path: str, *, token: str | None = "default", **kw: Any) -> httpx.Response:
        headers = (
            {}
            if token is None
            else {"Authorization": f"Bearer {self.token if token == 'default' else token}"}
        )
        return httpx.request(method, self.url + path, headers=headers, **{"timeout": 30, **kw})

    def wait(self, job_id: str, timeout: float = 120, poll_s: float = 0.05) -> JobStatus:
        deadline = time.monotonic() + timeout
        with self.client() as c:
            while True:
                status = c.status(job_id)
                if status.state in ("succeeded", "failed", "cancelled"):
                    return status
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{job_id} still {status.state} after {timeout}s; log: {self.log_tail()}"
                    )
                time.sleep(poll_s)

    def status(self, job_id: str) -> JobStatus:
        with self.client() as c:
            return c.status(job_id)

    def submit(self, spec: JobSpec) -> JobStatus:
        with self.client() as c:
            return c.submit(spec)

    def log_tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return int(self.process.returncode)


def start_worker(
    workdir: Path,
    *,
    engine: str = "simulated",
    model: str | None = None,
    engine_args: dict[str, Any] | None = None,
    concurrency: int = 4,
    allow: list[str] | None = None,
    extra: list[str] | None = None,
    python: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
) -> WorkerProcess:
    workdir.mkdir(parents=True, exist_ok=True)
    name = uuid.uuid4().hex[:8]
    announce = workdir / f"worker-{name}.json"
    log = workdir / f"worker-{name}.log"
    bin_dir = Path(python or sys.executable).parent
    cmd = [
        str(bin_dir / "batchinfer"),
        "worker",
        "serve",
        "--engine",
        engine,
        "--concurrency",
        str(concurrency),
        "--announce-file",
        str(announce),
        "--drain-timeout",
        "60",
    ]
    if model:
        cmd += ["--model", model]
    for k, v in (engine_args or {}).items():
        cmd += ["--engine-arg", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    for prefix in allow if allow is not None else [str(workdir)]:
        cmd += ["--allow-prefix", prefix]
    cmd += extra or []
    full_env = {**os.environ, "BATCHINFER_WORKER_TOKEN": TOKEN, "OMP_NUM_THREADS": "1", **(env or {})}
    with log.open("wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env)
    deadline = time.monotonic() + timeout
    while not announce.exists():
        if process.poll() is not None:
            raise RuntimeError(
                f"worker exited with {process.returncode}:\n{log.read_text(errors='replace')[-4000:]}"
            )
        if time.monotonic() > deadline:
            process.kill()
            raise TimeoutError(
                f"worker not ready after {timeout}s:\n{log.read_text(errors='replace')[-4000:]}"
            )
        time.sleep(0.05)
    info = json.loads(announce.read_text())
    return WorkerProcess(info["url"], TOKEN, process, log)
