"""Issue 22, item 8: the open probe ``/v1/ready`` says only ready or not to a caller without the token.

A worker whose engine fails to load keeps the error (its type and message: model paths, options,
hosts) for the callers that hold the token; the kubelet's probe and anyone else on the network get
the status code and ``{"ready": false}``. The worker app is the real one, served by uvicorn on
127.0.0.1 over real HTTP; it is not stopped on the load error (``on_fatal`` unset) so the answer
can be read.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from airflow_batchinfer.engines.simulated import SimulatedEngine
from airflow_batchinfer.worker.app import create_app
from airflow_batchinfer.worker.config import WorkerConfig
from airflow_batchinfer.worker.runtime import Runtime
from tests.support.seaweedfs import free_port

pytestmark = pytest.mark.security

TOKEN = "ready-token-" + "y" * 24
SECRET_DETAIL = "/models/customer-a/llama-70b: no such file (s3://internal-bucket/weights)"


class _CannotLoad(SimulatedEngine):
    async def start(self) -> None:
        raise OSError(SECRET_DETAIL)


@pytest.fixture
def failed_worker(tmp_path: Path) -> Iterator[str]:
    config = WorkerConfig(token=TOKEN, allowed_prefixes=[str(tmp_path)], drain_timeout_s=1)
    app = create_app(config, Runtime(_CannotLoad()))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while app.state.load_state["load_error"] is None or not server.started:
        assert time.monotonic() < deadline, "the worker app did not start"
        time.sleep(0.05)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def _ready(url: str, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.get(f"{url}/v1/ready", headers=headers or {}, timeout=10)


def test_without_the_token_ready_says_only_not_ready(failed_worker: str) -> None:
    for headers in (None, {"Authorization": "Bearer wrong-token"}, {"Authorization": TOKEN}):
        r = _ready(failed_worker, headers)
        assert r.status_code == 503
        assert r.json() == {"ready": False}, headers
        assert "customer-a" not in r.text and "OSError" not in r.text


def test_with_the_token_ready_gives_the_load_error(failed_worker: str) -> None:
    r = _ready(failed_worker, {"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 503
    assert r.json() == {"ready": False, "reason": f"OSError: {SECRET_DETAIL}"}


def test_health_tells_only_that_the_process_answers(failed_worker: str) -> None:
    r = httpx.get(f"{failed_worker}/v1/health", timeout=10)
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"status", "instance"} and body["status"] == "ok"
    assert "customer-a" not in r.text
