"""The local pool's readiness wait, without workers: its poll schedule, the announcements it reads
and what it says when a worker does not come up (no sockets: the workers here never announce)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.exceptions import ConfigError, WorkerUnavailable
from airflow_batchinfer.pools import local_workers
from airflow_batchinfer.pools.local import LocalPool
from airflow_batchinfer.pools.local_workers import POLL_MAX_S, POLL_MIN_S, poll_delay


@pytest.fixture
def pool(tmp_path: Path) -> LocalPool:
    pool = LocalPool("t", state_dir=tmp_path)
    pool._make_token()
    return pool


def worker(pool: LocalPool, wid: str, pid: int) -> dict[str, Any]:
    log = pool.dir / f"worker-{wid}.log"
    log.write_text("loading the model...\nValueError: no such model directory /models/x\n")
    return {
        "id": wid,
        "pid": pid,
        "url": None,
        "announce": str(pool.dir / f"worker-{wid}.json"),
        "log": str(log),
    }


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that never announces (a worker still loading its model)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def test_the_wait_looks_often_at_first_then_backs_off_to_a_cap() -> None:
    assert poll_delay(0.0) == POLL_MIN_S == 0.005
    assert poll_delay(0.5) == pytest.approx(0.025)  # 1/20 of the time waited: a start is seen late by 5%
    assert poll_delay(60.0) == POLL_MAX_S == 0.25  # a long model load: four looks a second
    delays = [poll_delay(t / 10) for t in range(1000)]
    assert delays == sorted(delays)


def test_announcements_fill_in_the_urls(pool: LocalPool) -> None:
    one, two, starting = worker(pool, "a", 1), worker(pool, "b", 2), worker(pool, "c", 3)
    for w, n in ((one, 1), (two, 2)):
        Path(w["announce"]).write_text(
            json.dumps({"version": 1, "url": f"http://127.0.0.1:{n}", "pid": n, "started_at": 2.0})
        )
    got = local_workers.announced([one, two, starting])
    assert [w["url"] for w in got] == ["http://127.0.0.1:1", "http://127.0.0.1:2", None]


def test_an_announcement_of_another_release_is_refused_not_waited_for(pool: LocalPool) -> None:
    w = worker(pool, "a", 1)
    Path(w["announce"]).write_text(json.dumps({"version": 9, "url": "http://127.0.0.1:1", "pid": 1}))
    with pytest.raises(ConfigError, match="version 9") as err:
        local_workers.announced([w])
    assert w["announce"] in str(err.value) and "Remedy" in str(err.value)


def test_a_worker_that_exits_while_starting_is_named_with_its_log_and_the_remedy(pool: LocalPool) -> None:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()  # exited and reaped: its pid is no process
    w = worker(pool, "dead", done.pid)
    with pytest.raises(WorkerUnavailable) as err:
        local_workers.wait_ready(str(pool), [w], pool.token(), timeout_s=60)
    msg = str(err.value)
    assert "local worker dead of local://t exited while starting" in msg
    assert w["log"] in msg and "no such model directory /models/x" in msg and "Remedy" in msg


def test_a_worker_not_ready_in_time_is_named_with_its_log(
    pool: LocalPool, sleeper: subprocess.Popen[bytes]
) -> None:
    w = worker(pool, "slow", sleeper.pid)
    with pytest.raises(WorkerUnavailable) as err:
        local_workers.wait_ready(str(pool), [w], pool.token(), timeout_s=0)
    msg = str(err.value)
    assert "1 of 1 local workers of local://t not ready after 0 s" in msg
    assert w["log"] in msg and "longer timeout" in msg
