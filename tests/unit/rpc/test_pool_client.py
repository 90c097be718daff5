"""PoolClient against injected transports (no sockets): least-loaded choice, 429 fallthrough."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from airflow_batchinfer.exceptions import AuthenticationError, BadJobError, WorkerBusy, WorkerUnavailable
from airflow_batchinfer.rpc.client import WorkerClient
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.rpc.pool import PoolClient
from airflow_batchinfer.state.docs import write_job_manifest
from tests.support.fake_jobs import counted, job_manifest
from tests.support.locate import REFUSED, connect_error

SPEC = JobSpec(
    job_id="j1", kind="infer", input="/tmp/x.jsonl", outputs={"inferred": "/tmp/o", "manifest": "/tmp/m"}
)


def fake_workers(
    free: dict[str, int], refuse: set[str], jobs: dict[str, str] | None = None
) -> tuple[httpx.MockTransport, list[str]]:
    """``jobs``: worker → the state of the job it already has (others answer 404 for it)."""
    calls: list[str] = []
    jobs = jobs or {}

    def handler(request: httpx.Request) -> httpx.Response:
        host = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        assert request.headers["authorization"] == "Bearer tok"
        if host not in free:
            raise connect_error(request, REFUSED)  # nothing listens: gone at once, no grace waited
        if request.method == "GET" and request.url.path.startswith("/v1/jobs/"):
            if host not in jobs:
                return httpx.Response(404, json={"error": "not_found", "detail": "no such job"})
            return httpx.Response(200, json={"job_id": "j1", "kind": "infer", "state": jobs[host]})
        if request.url.path == "/v1/stats":
            return httpx.Response(
                200,
                json={
                    "engine": {},
                    "slots_total": 4,
                    "slots_busy": 4 - free[host],
                    "draining": False,
                    "jobs": {},
                    "batcher": {},
                },
            )
        calls.append(host)
        if host in refuse:
            return httpx.Response(429, json={"error": "busy", "detail": "full"})
        body = json.loads(request.content)
        return httpx.Response(202, json={"job_id": body["job_id"], "kind": "infer", "state": "running"})

    return httpx.MockTransport(handler), calls


async def test_submits_to_least_loaded_and_moves_on_at_429() -> None:
    free = {"http://a:1": 1, "http://b:1": 3, "http://c:1": 2}
    transport, calls = fake_workers(free, refuse={"http://b:1"})
    pool = PoolClient([*list(free), "http://dead:1"], token="tok", transport=transport)
    url, status = await pool.submit(SPEC)
    assert calls == ["http://b:1", "http://c:1"]  # most free first; b answered 429
    assert url == "http://c:1" and status.state == "running"
    await pool.aclose()


async def test_a_job_runs_on_at_most_one_worker() -> None:
    free = {"http://a:1": 3, "http://b:1": 1, "http://c:1": 2}
    transport, calls = fake_workers(
        free, refuse=set(), jobs={"http://b:1": "running", "http://c:1": "failed"}
    )
    pool = PoolClient(list(free), token="tok", transport=transport)
    url, status = await pool.submit_when_free(SPEC)
    assert (url, status.state, calls) == ("http://b:1", "running", [])  # followed, not submitted again
    url, _ = await pool.submit(SPEC, locate=False)  # a first try skips the question
    assert url == "http://a:1" and calls == ["http://a:1"]
    transport, calls = fake_workers(free, refuse=set(), jobs={"http://c:1": "cancelled"})
    pool = PoolClient(list(free), token="tok", transport=transport)
    assert (await pool.submit(SPEC))[0] == "http://a:1" and calls == ["http://a:1"]  # a dead copy: run anew
    await pool.aclose()


async def test_all_busy_and_none_reachable() -> None:
    transport, _ = fake_workers({"http://a:1": 0}, refuse={"http://a:1"})
    pool = PoolClient(["http://a:1"], token="tok", transport=transport)
    with pytest.raises(WorkerBusy, match="busy"):
        await pool.submit(SPEC)
    pool2 = PoolClient(["http://gone:1"], token="tok", transport=transport)
    with pytest.raises(WorkerUnavailable, match="no worker"):
        await pool2.submit(SPEC)


@pytest.mark.parametrize(("code", "exc"), [(400, BadJobError), (401, AuthenticationError), (429, WorkerBusy)])
async def test_http_errors_map_to_exceptions(code: int, exc: type[Exception]) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(code, json={"error": "x", "detail": "the reason"})

    client = WorkerClient("http://w:1", token="t", transport=httpx.MockTransport(handler))
    with pytest.raises(exc, match="the reason"):
        await client.submit(SPEC)


def test_pool_needs_urls() -> None:
    with pytest.raises(ValueError, match="at least one"):
        PoolClient([], token=None)


async def test_a_discovering_pool_follows_workers_as_they_come_and_go() -> None:
    free = {"http://a:1": 1, "http://b:1": 3}
    transport, _ = fake_workers(free, refuse=set())
    current = ["http://a:1"]

    async def discover() -> list[str]:
        return list(current)

    pool = PoolClient([], token="tok", transport=transport, discover=discover, refresh_interval_s=3600)
    assert (await pool.submit(SPEC))[0] == "http://a:1"  # empty at first: asked at once
    current[:] = ["http://b:1"]  # a replaced, b arrived
    assert (await pool.submit(SPEC))[0] == "http://a:1"  # not asked again within the interval
    await pool.refresh(force=True)  # what a lost job triggers
    assert list(pool.clients) == ["http://b:1"]
    assert (await pool.submit(SPEC))[0] == "http://b:1"
    await pool.aclose()


@pytest.mark.parametrize("long_polls", [True, False])
async def test_follow_long_polls_a_running_job_and_never_spins_on_an_old_worker(long_polls: bool) -> None:
    """``follow`` asks a running job's worker with ``wait_s`` (the job's end is seen when it happens);
    a worker that predates long polls answers at once, and ``follow`` then waits out each interval
    instead of asking in a loop."""
    import asyncio
    import time

    from airflow_batchinfer.rpc.pool import follow

    asks: list[float] = []
    ends = time.monotonic() + 0.5

    async def handler(request: httpx.Request) -> httpx.Response:
        wait_s = float(request.url.params.get("wait_s", 0))
        asks.append(wait_s)
        if long_polls and wait_s:
            await asyncio.sleep(max(min(wait_s, ends - time.monotonic()), 0))
        state = "succeeded" if time.monotonic() >= ends else "running"
        return httpx.Response(200, json={"job_id": "j1", "kind": "infer", "state": state})

    worker = WorkerClient("http://a:1", token="tok", transport=httpx.MockTransport(handler))
    event = await follow(worker, "j1", poll_interval_s=0.2, lost_grace_s=5.0)
    assert event is not None and event.state == "succeeded"
    assert asks[0] == 0 and all(w == 0.2 for w in asks[1:])  # after the first answer, long polls
    assert 3 <= len(asks) <= 6  # about one ask per interval either way: never a busy loop


async def test_run_is_done_when_the_worker_remembers_the_job_and_the_manifest_is_another_jobs(
    tmp_path: Path,
) -> None:
    """A pinned input changed or a gate was answered again: the manifest at the job's place records
    another job id. The worker still has the job as succeeded (it forgets one only once its manifest
    is gone), so a resubmit would hear "succeeded" again without a run: the job is done, once, and the
    round's close checks the manifest's job id and fingerprint."""
    data = tmp_path / "x.jsonl"
    data.write_text('{"id": "a"}\n')
    manifest = str(tmp_path / "m.json")
    write_job_manifest(manifest, job_manifest(job_id="earlier", fingerprint="stale", counts=counted(ok=1)))
    spec = JobSpec(job_id="j1", kind="infer", input=str(data),
                   outputs={"inferred": str(tmp_path / "o.jsonl"), "manifest": manifest})  # fmt: skip
    asked: list[str] = []

    def remembers(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/stats":
            stats = {"engine": {}, "slots_total": 4, "slots_busy": 0, "draining": False}
            return httpx.Response(200, json={**stats, "jobs": {}, "batcher": {}})
        job_id = json.loads(request.content)["job_id"] if request.method == "POST" else request.url.path[9:]
        asked.append(f"{request.method} {job_id}")
        return httpx.Response(200, json={"job_id": job_id, "kind": "infer", "state": "succeeded"})

    pool = PoolClient(["http://a:1"], token="tok", transport=httpx.MockTransport(remembers),
                      poll_interval_s=0.01, max_resubmits=3)  # fmt: skip
    done = await pool.run(spec)
    assert (done.job_id, done.counts) == ("earlier", counted(ok=1))
    assert [a.split()[0] for a in asked] == ["GET", "POST"]  # asked, submitted once: no resubmit loop
    await pool.aclose()
