"""The local pool's worker processes: starting one detached (:func:`spawn`), whether one lives
(:func:`alive`), stopping them (:func:`stop`), the wait until they are ready (:func:`wait_ready`) and
the ends of their logs (:func:`log_tail`). :mod:`~airflow_batchinfer.pools.local` keeps the pool's
state files and leases and decides which workers run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from airflow_batchinfer.engines import secret_options
from airflow_batchinfer.exceptions import ConfigError, WorkerUnavailable
from airflow_batchinfer.rpc.client import SyncWorkerClient
from airflow_batchinfer.worker.announce import read_announcement

# The readiness wait looks at the starting workers 1/20 of the time waited so far apart, from 5 ms
# to 250 ms (a look: a file's stat and a /proc read per worker): a worker ready after 0.5 s is seen
# within ~25 ms; one whose model loads for minutes costs four looks a second.
POLL_MIN_S, POLL_MAX_S = 0.005, 0.25


def poll_delay(waited_s: float) -> float:
    """How long the readiness wait sleeps after ``waited_s`` seconds of waiting."""
    return min(POLL_MAX_S, max(POLL_MIN_S, waited_s / 20))


# Workers this process started: kept so they are reaped (not left as zombies) once they exit.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    child = _CHILDREN.get(pid)
    if child is not None:
        return child.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent) is not alive.
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ", 1)[1][:1] != "Z"
    return True


def log_tail(path: str | Path, chars: int = 1500) -> str:
    """The last ``chars`` bytes of a log file as text ("" when it cannot be read)."""
    with contextlib.suppress(OSError), open(path, "rb") as f:
        f.seek(max(f.seek(0, os.SEEK_END) - chars, 0))
        return f.read().decode(errors="replace")
    return ""


def spawn(cmd: list[str], log: Path) -> int:
    """Start ``cmd`` detached (its own session, output appended to ``log``); returns its pid. The
    workers' secrets come from the pool's secrets file alone, not from variables they inherit."""
    secret_env = {o.env for o in secret_options().values()}
    env = {k: v for k, v in os.environ.items() if k not in secret_env}
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**env, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
        )
    _CHILDREN[proc.pid] = proc
    return proc.pid


def stop(workers: list[dict[str, Any]], *, wait: bool, timeout_s: float = 60.0) -> None:
    """SIGTERM each worker; with ``wait``, until they exit, SIGKILL after ``timeout_s``."""
    for w in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(w["pid"]), signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while wait and any(alive(int(w["pid"])) for w in workers):
        if time.monotonic() > deadline:
            for w in workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(w["pid"]), signal.SIGKILL)
            break
        time.sleep(0.1)


def announced(workers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fill in the URL of workers started without waiting, once they have announced it."""
    for w in workers:
        if not w.get("url") and w.get("announce"):
            with contextlib.suppress(OSError):
                if (found := read_announcement(w["announce"])) is not None:
                    w["url"] = found.url
    return workers


def startups(workers: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The start-up marks of each worker that has announced itself (worker id → mark → Unix time);
    a worker still starting, or gone (its announcement removed), has none."""
    out: dict[str, dict[str, float]] = {}
    for w in workers:
        with contextlib.suppress(OSError, ConfigError):
            if w.get("announce") and (found := read_announcement(w["announce"])) is not None:
                out[str(w["id"])] = dict(found.startup)
    return out


def wait_ready(
    pool: str, workers: list[dict[str, Any]], token: str, timeout_s: float
) -> list[dict[str, Any]]:
    """Until every worker of ``pool`` has announced itself and answers ``/v1/ready`` (with the RPC
    ``token``); each one is asked as soon as it announces (the others may still be starting)."""
    start = time.monotonic()
    pending = list(workers)
    # One transport for every worker's client: its TLS context (unused on http://, yet built
    # by each new client, tens of ms) is built once.
    transport = httpx.HTTPTransport()
    try:
        while True:
            for w in list(pending):
                if not w.get("url") and (found := read_announcement(w["announce"])) is not None:
                    w["url"] = found.url
                if w.get("url"):
                    if not SyncWorkerClient(w["url"], token=token, transport=transport).ready():
                        raise WorkerUnavailable(
                            f"local worker {w['id']} ({w['url']}) announced itself but is not ready "
                            f"(draining or stopping); log {w['log']}:\n{log_tail(w['log'], 3000)}"
                        )
                    pending.remove(w)
                elif not alive(int(w["pid"])):
                    raise WorkerUnavailable(
                        f"local worker {w['id']} of {pool} exited while starting; log {w['log']}:\n"
                        f"{log_tail(w['log'], 3000)}\nRemedy: fix what the log says (model path, "
                        "engine options), then start the pool again"
                    )
            if not pending:
                return workers
            waited = time.monotonic() - start
            if waited > timeout_s:
                raise WorkerUnavailable(
                    f"{len(pending)} of {len(workers)} local workers of {pool} not ready after "
                    f"{timeout_s:.0f} s; their logs: {', '.join(w['log'] for w in pending)}. Remedy: "
                    "see what they are doing there; a large model may need a longer timeout"
                )
            time.sleep(poll_delay(waited))
    finally:
        transport.close()
