"""Whether a job already runs somewhere: the pure decision (no sockets), and the pool client acting on
it over injected transports (a silent worker holds a submission up; a gone one does not)."""

from __future__ import annotations

import argparse
import errno
import inspect
import socket
import time

import httpx
import pytest

from airflow_batchinfer.exceptions import ConfigError, WorkerUnavailable
from airflow_batchinfer.rpc.locate import (
    LOCATE_TIMEOUT_S,
    SUBMIT_TIMEOUT_S,
    UNREACHABLE_GRACE_S,
    WorkerAnswer,
    locate_decision,
)
from airflow_batchinfer.rpc.pool import PoolClient
from airflow_batchinfer.spec.settings import setting
from airflow_batchinfer.state.config import RunConfig
from tests.support.locate import REFUSED, SPEC, A, B, connect_error, workers


def silent(url: str, s: float, **kw: object) -> WorkerAnswer:
    return WorkerAnswer(url, answered=False, unreachable_s=s, error="ReadTimeout", **kw)  # type: ignore[arg-type]


def test_a_live_copy_is_found_whatever_the_others_say() -> None:
    got = locate_decision([silent(A, 1), WorkerAnswer(B, state="running")], grace_s=120)
    assert (got.verdict, got.url) == ("found", B)


def test_a_silent_worker_makes_the_answer_unknown_until_its_grace_passes() -> None:
    """The bug: a worker that did not answer within the ask's timeout counted as "not running it"."""
    got = locate_decision([silent(A, 6), WorkerAnswer(B)], grace_s=120)
    assert got.verdict == "unknown" and [u for u, _ in got.waiting] == [A]
    assert "6 s of unreachable_grace_s 120 s" in got.waiting[0][1]
    gone = locate_decision([silent(A, 121), WorkerAnswer(B)], grace_s=120)
    assert gone.verdict == "not_found" and [u for u, _ in gone.gone] == [A]
    assert "past unreachable_grace_s" in gone.gone[0][1]


@pytest.mark.parametrize("why", [{"listed": False}, {"refused": True}], ids=["unlisted", "refused"])
def test_a_worker_the_pool_no_longer_lists_or_where_nothing_listens_is_gone(why: dict[str, bool]) -> None:
    got = locate_decision([silent(A, 0, **why), WorkerAnswer(B, state="failed")], grace_s=120)
    assert got.verdict == "not_found" and [u for u, _ in got.gone] == [A] and got.waiting == ()


async def test_a_submission_waits_while_a_worker_that_may_run_the_job_is_silent() -> None:
    transport, submitted = workers({A}, {})
    pool = PoolClient([A, B], token="t", transport=transport, poll_interval_s=0.05, unreachable_grace_s=0.4)
    started = time.monotonic()
    url, _ = await pool.submit(SPEC)
    assert url == B and submitted == [B]
    assert time.monotonic() - started >= 0.4  # not before the silent worker's grace passed
    await pool.aclose()


async def test_a_silent_worker_past_the_deadline_fails_the_submission_naming_it() -> None:
    transport, submitted = workers({A}, {})
    pool = PoolClient([A, B], token="t", transport=transport, poll_interval_s=0.05, unreachable_grace_s=60)
    with pytest.raises(WorkerUnavailable, match=r"http://a:1 .*may still run it.*unreachable_grace_s"):
        await pool.submit_when_free(SPEC, deadline=time.monotonic() + 0.3)
    assert submitted == []
    await pool.aclose()


async def test_a_silent_worker_the_pool_drops_no_longer_holds_the_submission() -> None:
    transport, submitted = workers({A}, {})
    listed = [[A, B], [B]]

    async def discover() -> list[str]:
        return listed.pop(0) if len(listed) > 1 else listed[0]

    pool = PoolClient([], token="t", transport=transport, discover=discover, poll_interval_s=0.05,
                      unreachable_grace_s=60)  # fmt: skip
    url, _ = await pool.submit(SPEC)  # A is silent, then no longer listed: taken for gone
    assert url == B and submitted == [B]
    await pool.aclose()


def failing_connects(a_fails: BaseException) -> tuple[httpx.MockTransport, list[str]]:
    """Connects to A fail with ``a_fails``; B answers (no job: 404; submits accepted)."""
    inner, submitted = workers(set(), {})

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "a":
            raise connect_error(request, a_fails)
        return inner.handler(request)  # type: ignore[no-any-return]

    return httpx.MockTransport(handler), submitted


UNROUTED = {
    "host unreachable": OSError(errno.EHOSTUNREACH, "No route to host"),
    "network unreachable": OSError(errno.ENETUNREACH, "Network is unreachable"),
    "name lookup failed": socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
    "one address refused, one unreachable": ExceptionGroup(
        "multiple connection attempts failed", [REFUSED, OSError(errno.EHOSTUNREACH, "No route to host")]
    ),
}


async def test_a_worker_whose_address_refuses_connections_is_gone_at_once() -> None:
    transport, submitted = failing_connects(REFUSED)
    pool = PoolClient([A, B], token="t", transport=transport, poll_interval_s=0.05, unreachable_grace_s=60)
    url, _ = await pool.submit_when_free(SPEC, deadline=time.monotonic() + 5)
    assert url == B and submitted == [B]
    await pool.aclose()


@pytest.mark.parametrize("cause", list(UNROUTED.values()), ids=list(UNROUTED))
async def test_a_worker_that_cannot_be_reached_still_holds_the_copy(cause: BaseException) -> None:
    """Should-fix 1: httpx raises ConnectError for an unreachable host or network and a failed name
    lookup too; a partitioned node's pod keeps running, so only ECONNREFUSED counts as gone (each of
    these started a copy on B at once before)."""
    transport, submitted = failing_connects(cause)
    pool = PoolClient([A, B], token="t", transport=transport, poll_interval_s=0.05, unreachable_grace_s=60)
    with pytest.raises(WorkerUnavailable, match=r"http://a:1 .*may still run it"):
        await pool.submit_when_free(SPEC, deadline=time.monotonic() + 0.3)
    assert submitted == []
    await pool.aclose()


def test_unreachable_grace_s_is_one_bounded_setting() -> None:
    """Should-fix 6: 0 switched the protection off, and a grace longer than a try's wait for a worker
    never elapses (each try starts a fresh client). One default and bounds for every consumer."""
    grace = setting("unreachable_grace_s")
    assert grace.minimum == LOCATE_TIMEOUT_S and grace.maximum is not None
    assert grace.maximum < SUBMIT_TIMEOUT_S - 2 * LOCATE_TIMEOUT_S  # room for the asks around it
    defaults = (grace.default, RunConfig.setting_fields()["unreachable_grace_s"].default,
                inspect.signature(PoolClient).parameters["unreachable_grace_s"].default)  # fmt: skip
    assert set(defaults) == {UNREACHABLE_GRACE_S}
    for text in ("0", "4", str(SUBMIT_TIMEOUT_S)):
        with pytest.raises(argparse.ArgumentTypeError):
            grace.parse(text)
    assert grace.parse(str(LOCATE_TIMEOUT_S)) == LOCATE_TIMEOUT_S
    run = {"input": "/d.jsonl", "run_root": "/r", "prompt_template": "{{ q }}", "judge": {"type": "length"}}
    for bad in (0, SUBMIT_TIMEOUT_S):
        with pytest.raises(ConfigError, match=r"unreachable_grace_s .* outside .*set it within"):
            RunConfig.of(**run, unreachable_grace_s=bad)
    widest = RunConfig.of(**run, unreachable_grace_s=grace.maximum)
    assert widest.sharding.unreachable_grace_s == grace.maximum
