"""The worker checks the bearer token from the headers before it reads a byte of the body, and bounds
the body it reads (``--max-body-bytes``): an unauthenticated client cannot make it allocate, and an
authenticated one cannot make it allocate more than the limit. Over real HTTP, a real worker."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.workers import TOKEN, WorkerProcess, start_worker

pytestmark = [pytest.mark.security, pytest.mark.slow]

MB = 1024 * 1024


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    w = start_worker(tmp_path_factory.mktemp("guard"), concurrency=1)
    yield w
    w.stop()


def _connect(w: WorkerProcess, timeout: float) -> socket.socket:
    url = urlsplit(w.url)
    sock = socket.create_connection((url.hostname, url.port), timeout=timeout)
    return sock


def _head(path: str, headers: dict[str, str], method: str = "POST") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: worker", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _response(sock: socket.socket) -> tuple[int, dict[str, str], Any]:
    """Status, headers and JSON body of the one response on ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    # The worker closes a connection whose body it will not read: the client's TCP stack may then
    # drop the response body on a reset. The status line is what these tests need; the body when whole.
    whole = length and len(body) >= length
    return int(status_line.split()[1]), headers, json.loads(body[:length]) if whole else None


def _peak_rss_kb(w: WorkerProcess) -> int:
    for line in Path(f"/proc/{w.process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def _stream(sock: socket.socket, total: int, *, chunked: bool) -> int:
    """Send up to ``total`` bytes of body; stop when the server stops reading. Returns bytes sent."""
    block = b"x" * (256 * 1024)
    sent = 0
    try:
        while sent < total:
            payload = block[: total - sent]
            sock.sendall(b"%x\r\n%s\r\n" % (len(payload), payload) if chunked else payload)
            sent += len(payload)
        if chunked:
            sock.sendall(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError, TimeoutError):
        pass
    return sent


@pytest.mark.parametrize("token", [None, "wrong-token"])
def test_unauthenticated_50mb_body_gets_401_without_being_read(
    worker: WorkerProcess, token: str | None
) -> None:
    """Headers announce 50 MB, only a few bytes follow: the 401 must come back at once (the old
    worker waited for the whole body, to parse it, before it looked at the token)."""
    headers = {"Content-Type": "application/json", "Content-Length": str(50 * MB)}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    with _connect(worker, timeout=5) as sock:
        started = time.monotonic()
        sock.sendall(_head("/v1/jobs", headers) + b'{"job_id": ')
        status, resp_headers, body = _response(sock)
        elapsed = time.monotonic() - started
    assert status == 401
    assert resp_headers["www-authenticate"] == "Bearer"
    assert body == {"error": "unauthorized", "detail": "missing or wrong bearer token"}
    assert elapsed < 2.0


def test_authenticated_oversized_body_is_413_from_content_length(worker: WorkerProcess) -> None:
    headers = {
        "Content-Type": "application/json",
        "Content-Length": str(50 * MB),
        "Authorization": f"Bearer {TOKEN}",
    }
    with _connect(worker, timeout=5) as sock:
        sock.sendall(_head("/v1/jobs", headers) + b'{"job_id": ')
        status, _, body = _response(sock)
    assert status == 413
    assert body["error"] == "payload_too_large" and "1048576 bytes" in body["detail"]


def test_authenticated_oversized_chunked_body_is_413_and_memory_stays_flat(worker: WorkerProcess) -> None:
    headers = {
        "Content-Type": "application/json",
        "Transfer-Encoding": "chunked",
        "Authorization": f"Bearer {TOKEN}",
    }
    before = _peak_rss_kb(worker)
    with _connect(worker, timeout=10) as sock:
        sock.sendall(_head("/v1/jobs", headers))
        _stream(sock, 50 * MB, chunked=True)
        status, _, body = _response(sock)
    assert status == 413, body
    assert body["error"] == "payload_too_large"
    assert _peak_rss_kb(worker) - before < 16 * 1024  # KiB: the 50 MB never sat in the worker
    assert worker.http("GET", "/v1/health", token=None).status_code == 200


def test_unauthenticated_50mb_body_streamed_does_not_grow_the_worker(worker: WorkerProcess) -> None:
    before = _peak_rss_kb(worker)
    headers = {"Content-Type": "application/json", "Content-Length": str(50 * MB)}
    with _connect(worker, timeout=10) as sock:
        sock.sendall(_head("/v1/jobs", headers))
        _stream(sock, 50 * MB, chunked=False)
        status, _, _ = _response(sock)
    assert status == 401
    assert _peak_rss_kb(worker) - before < 16 * 1024
    headers["Transfer-Encoding"] = "chunked"
    del headers["Content-Length"]
    with _connect(worker, timeout=10) as sock:
        sock.sendall(_head("/v1/jobs", headers))
        _stream(sock, 50 * MB, chunked=True)
        status, _, _ = _response(sock)
    assert status == 401
    assert _peak_rss_kb(worker) - before < 16 * 1024


def test_every_path_but_the_probes_needs_the_token(worker: WorkerProcess) -> None:
    for method, path in [("GET", "/v1/stats"), ("GET", "/metrics"), ("GET", "/v1/nope"), ("GET", "/docs")]:
        r = worker.http(method, path, token=None)
        assert r.status_code == 401, path
        assert r.json()["error"] == "unauthorized"
    assert worker.http("GET", "/v1/health", token=None).status_code == 200
    assert worker.http("GET", "/v1/ready", token=None).status_code == 200


def test_a_body_within_the_limit_still_works(worker: WorkerProcess) -> None:
    r = worker.http("POST", "/v1/jobs", json={"job_id": "x"})  # authenticated, small, invalid
    assert r.status_code == 400 and r.json()["error"] == "bad_request"
    r = httpx.post(
        worker.url + "/v1/jobs",
        content=b"{not json",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"},
    )
    assert r.status_code == 400


def test_max_body_bytes_flag(tmp_path: Path) -> None:
    w = start_worker(tmp_path, extra=["--max-body-bytes", "2000"])
    try:
        big = {"job_id": "x", "params": {"pad": "y" * 4000}}
        r = w.http("POST", "/v1/jobs", json=big)
        assert r.status_code == 413 and "2000 bytes" in r.json()["detail"]
        assert w.http("POST", "/v1/jobs", json={"job_id": "x"}).status_code == 400
    finally:
        w.stop()
    with pytest.raises(RuntimeError, match="max-body-bytes must be >= 1024"):
        start_worker(tmp_path, extra=["--max-body-bytes", "1000"], timeout=20)


def test_insecure_no_auth_still_bounds_the_body(tmp_path: Path) -> None:
    w = start_worker(tmp_path, extra=["--insecure-no-auth"], env={"BATCHINFER_WORKER_TOKEN": ""})
    try:
        assert httpx.get(w.url + "/v1/stats").status_code == 200
        with _connect(w, timeout=5) as sock:
            sock.sendall(_head("/v1/jobs", {"Content-Length": str(50 * MB)}) + b"{")
            status, _, body = _response(sock)
        assert status == 413 and body["error"] == "payload_too_large"
    finally:
        w.stop()
