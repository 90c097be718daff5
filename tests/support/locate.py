"""A job spec and mock workers (httpx transports) for the tests of finding a job's worker."""

from __future__ import annotations

import errno

import httpcore
import httpx

from airflow_batchinfer.rpc.models import JobSpec

SPEC = JobSpec(
    job_id="j1", kind="infer", input="/tmp/x.jsonl", outputs={"inferred": "/tmp/o", "manifest": "/tmp/m"}
)


A, B = "http://a:1", "http://b:1"


def workers(silent_hosts: set[str], jobs: dict[str, str]) -> tuple[httpx.MockTransport, list[str]]:
    """Hosts in ``silent_hosts`` time out; ``jobs``: host → the job's state there (else 404)."""
    submitted: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        host = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        if host in silent_hosts:
            raise httpx.ReadTimeout("no answer", request=request)
        if request.url.path.startswith("/v1/jobs/"):
            if host not in jobs:
                return httpx.Response(404, json={"error": "not_found", "detail": "no such job"})
            return httpx.Response(200, json={"job_id": "j1", "kind": "infer", "state": jobs[host]})
        if request.url.path == "/v1/stats":
            stats = {"engine": {}, "slots_total": 4, "slots_busy": 0, "draining": False, "jobs": {}}
            return httpx.Response(200, json={**stats, "batcher": {}})
        submitted.append(host)
        return httpx.Response(202, json={"job_id": "j1", "kind": "infer", "state": "running"})

    return httpx.MockTransport(handler), submitted


def connect_error(request: httpx.Request, cause: BaseException) -> httpx.ConnectError:
    """A failed connect as httpx raises it: its ConnectError over httpcore's, over anyio's OSError
    ("All connection attempts failed"), over the OS error of the attempt (or a group, several)."""
    attempts = OSError("All connection attempts failed")
    attempts.__cause__ = cause
    core = httpcore.ConnectError(attempts)
    core.__cause__ = attempts
    error = httpx.ConnectError(str(core), request=request)
    error.__cause__ = core
    return error


REFUSED = ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed")
