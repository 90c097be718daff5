"""A throwaway Airflow on this machine for the demo (and, extended, the tests and the Airflow benchmarks).

Starts api-server, scheduler, dag-processor and triggerer as separate processes on 127.0.0.1 with a
SQLite database and the LocalExecutor, creates the Airflow pools the DAGs use (``include_deferred``),
and talks to it through the public REST API only (``/api/v2``), as a user's automation would.
Everything lives in ``home``; :meth:`DevAirflow.stop` ends every process it started by PID.
:mod:`airflow_batchinfer.dev.local_airflow` adds what only tests and benchmarks do to it (kill and
restart components, find task processes, read task logs, fast failure detection).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from airflow_batchinfer.exceptions import BatchInferError
from airflow_batchinfer.pools.local_workers import log_tail

COMPONENTS: dict[str, list[str]] = {
    "api-server": ["api-server", "--workers", "1"],
    "scheduler": ["scheduler", "--skip-serve-logs"],
    "dag-processor": ["dag-processor"],
    "triggerer": ["triggerer", "--skip-serve-logs"],
}
TERMINAL_RUN_STATES = ("success", "failed")
DB_ERROR_TRIES = 4


class AirflowApiError(BatchInferError, RuntimeError):
    """Airflow's REST API answered an error (``status``), for :class:`DevAirflow`'s client."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class DevAirflow:
    """:param home: ``AIRFLOW_HOME`` (database, logs, config). :param dags_folder: the DAG files.
    :param parallelism: the executor's task slots. :param env: extra environment for every process
    (and so for tasks and triggers)."""

    home: Path
    dags_folder: Path
    port: int = 0
    parallelism: int = 8
    env: dict[str, str] = field(default_factory=dict)
    username: str = "admin"
    password: str = field(default_factory=lambda: secrets.token_urlsafe(12))
    python: str = sys.executable
    # the processes to run, by name: ``airflow`` CLI arguments each
    components: dict[str, list[str]] = field(default_factory=lambda: dict(COMPONENTS))
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _token: str | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def environ(self, component: str | None = None) -> dict[str, str]:
        """The environment of ``component`` (``None``: the CLI): the same for every one here."""
        home = str(self.home)
        return {
            **os.environ,
            "AIRFLOW_HOME": home,
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": str(self.parallelism),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__FERNET_KEY": self._secret("fernet"),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{self.username}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": f"{home}/passwords.json",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            # four processes write to one SQLite file: a writer waits up to 60 s for the lock
            # (with sqlite3's 5 s, a DAG-run trigger met a "Database error" on a busy CI machine)
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db?timeout=60",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API__SECRET_KEY": self._secret("api"),
            "AIRFLOW__API_AUTH__JWT_SECRET": self._secret("jwt"),
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": f"{home}/logs",
            # new DAG files are found within 5 s, and a changed file is parsed again at once (the
            # dag-processor orders files by mtime); an unchanged one only every 2 minutes: each parse
            # costs about 2 CPU seconds, so every 5 s kept most of a core busy on an idle Airflow
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "120",
            # a DAG whose file was parsed while its own row was not updated for this long is
            # deactivated (a trigger then answers 404); on a busy 2-core machine the default 50 s
            # deactivated live DAGs between two parses
            "AIRFLOW__DAG_PROCESSOR__STALE_DAG_THRESHOLD": "600",
            # parsing a DAG file took over 50 s (the default's kill) beside a second Airflow and a
            # browser on 2 cores: a killed parse leaves its DAGs unparsed
            "AIRFLOW__DAG_PROCESSOR__DAG_FILE_PROCESSOR_TIMEOUT": "180",
            "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": "150",
            # each task waits up to this long for the scheduler's next pass (1 s by default)
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.2",
            "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "120",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
            **self.env,
        }

    def _secret(self, name: str) -> str:
        """Per-home secrets, made once, so every component (and a restart) agrees on them."""
        path = self.home / "secrets.json"
        data = json.loads(path.read_text()) if path.exists() else {}
        if name not in data:
            if name == "fernet":
                from cryptography.fernet import Fernet

                data[name] = Fernet.generate_key().decode()
            else:
                data[name] = secrets.token_urlsafe(32)
            path.write_text(json.dumps(data))
            path.chmod(0o600)
        return str(data[name])

    def airflow(self, *args: str, check: bool = True, timeout: float = 600) -> str:
        """Run one ``airflow`` CLI command with this instance's environment; returns its output."""
        out = subprocess.run(
            [str(Path(self.python).parent / "airflow"), *args],
            env=self.environ(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and out.returncode != 0:
            raise RuntimeError(f"airflow {' '.join(args)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
        return out.stdout

    # ------------------------------------------------------------------------------- lifecycle
    def start(self, *, pools: dict[str, int] | None = None, timeout_s: float = 300) -> DevAirflow:
        self.home.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        self._prepare()
        (self.home / "logs").mkdir(exist_ok=True)
        for name in self.components:
            self._spawn(name)
        self._wait(lambda: self._healthy(), timeout_s, "the api-server to answer")
        for name, slots in (pools or {}).items():  # before any DAG run: nothing is triggered yet
            self.set_pool(name, slots)
        self._warm_execution_api()
        return self

    def _prepare(self) -> None:
        """Before the components start: the database and the admin's login."""
        (self.home / "passwords.json").write_text(json.dumps({self.username: self.password}))
        self.airflow("db", "migrate")

    def _warm_execution_api(self) -> None:
        """Answer one request of the api-server's task execution API now: its first request builds
        the API (about 2.5 s here, the api-server answering nothing else meanwhile), which would
        otherwise hold up the first tasks of the first DAG run, as it does nowhere in a deployment
        that has been up for a while."""
        with contextlib.suppress(httpx.HTTPError):
            httpx.get(f"{self.url}/execution/health", timeout=60)

    def _spawn(self, name: str, *, cwd: Path | None = None) -> None:
        """Start component ``name`` (in ``cwd``; ``None``: this process's working directory)."""
        log = open(self.home / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        self.procs[name] = subprocess.Popen(
            [str(Path(self.python).parent / "airflow"), *self.components[name]],
            env=self.environ(name),
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: stop() ends its children too
        )
        log.close()

    def set_pool(self, name: str, slots: int) -> None:
        """An Airflow pool that counts deferred tasks too (``include_deferred``): see the README. Made
        through the REST API (an ``airflow pools set`` costs a CLI start: 3-4 CPU seconds each)."""
        body = {"slots": slots, "description": f"batchinfer shard slots ({name})", "include_deferred": True}
        try:
            self.api("POST", "/pools", json={"name": name, **body})
        except AirflowApiError as exc:
            if exc.status != 409:  # 409: it exists (a home started before): set it as asked
                raise
            self.api("PATCH", f"/pools/{name}", json={"pool": name, **body})

    def _healthy(self) -> bool:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"airflow {name} exited ({proc.returncode}); see {self.log(name)}")
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{self.url}/api/v2/monitor/health", timeout=5).status_code == 200
        return False

    def log(self, component: str) -> Path:
        return self.home / "logs" / f"{component}.log"

    def stop(self, timeout_s: float = 30) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the group: task runners forked by the executor
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
        self.procs.clear()

    def __enter__(self) -> DevAirflow:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @staticmethod
    def _wait(ready: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.5) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
            time.sleep(poll_s)

    # -------------------------------------------------------------------------------- REST API
    def token(self) -> str:
        if self._token is None:
            r = httpx.post(
                f"{self.url}/auth/token",
                json={"username": self.username, "password": self.password},
                timeout=30,
            )
            r.raise_for_status()
            self._token = str(r.json()["access_token"])
        return self._token

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        """One REST call. A request that met a database error is sent again (up to
        ``DB_ERROR_TRIES`` times): SQLite can refuse a write at once when another process's write
        overtook this one's snapshot, and Airflow rolled the failed request's transaction back."""
        for attempt in range(1, DB_ERROR_TRIES + 1):
            r = httpx.request(
                method,
                f"{self.url}/api/v2{path}",
                headers={"Authorization": f"Bearer {self.token()}"},
                timeout=60,
                **kwargs,
            )
            if not (r.status_code == 500 and "Database error" in r.text and attempt < DB_ERROR_TRIES):
                break
            time.sleep(attempt)
        if r.status_code >= 400:
            # a 5xx says "check the logs": the end of the api-server's is in the error
            log = self.log("api-server")
            ends = f"\n--- the end of {log}:\n{log_tail(log, 4000)}" if r.status_code >= 500 else ""
            raise AirflowApiError(f"{method} {path}: {r.status_code} {r.text[:2000]}{ends}", r.status_code)
        return r.json() if r.content else None

    def wait_for_dag(self, dag_id: str, timeout_s: float = 180) -> None:
        """Until the dag-processor has parsed ``dag_id`` (import errors are raised, not waited on)."""

        def parsed() -> bool:
            errors = self.api("GET", "/importErrors")["import_errors"]
            if errors:
                raise RuntimeError("DAG import errors:\n" + "\n".join(e["stack_trace"] for e in errors))
            with contextlib.suppress(RuntimeError):
                self.api("GET", f"/dags/{dag_id}")
                return True
            return False

        self._wait(parsed, timeout_s, f"DAG {dag_id} to be parsed", poll_s=1)

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None, run_id: str | None = None) -> str:
        # The run id is chosen here (in Airflow's own form), so a trigger sent again after a
        # database error cannot start a second run. A chosen id is new: if it already exists, the
        # first try did start the run before its answer failed.
        chosen = run_id is None
        run_id = run_id or f"manual__{datetime.now(UTC).isoformat()}"
        body: dict[str, Any] = {"logical_date": None, "conf": conf or {}, "dag_run_id": run_id}
        try:
            return str(self.api("POST", f"/dags/{dag_id}/dagRuns", json=body)["dag_run_id"])
        except AirflowApiError as exc:
            if chosen and exc.status == 409:
                return run_id
            raise

    def run_state(self, dag_id: str, run_id: str) -> str:
        return str(self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"])

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:
            page = self.api(
                "GET",
                f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances",
                params={"limit": 100, "offset": len(out)},
            )
            out += page["task_instances"]
            if not page["task_instances"] or len(out) >= page["total_entries"]:
                return out

    def pending_reviews(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """Open HITL requests of a run (the Required Actions page)."""
        details = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/hitlDetails")["hitl_details"]
        return [d for d in details if not d.get("response_received")]

    def respond(self, dag_id: str, run_id: str, task_id: str, option: str, map_index: int = -1) -> None:
        self.api(
            "PATCH",
            f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/{map_index}/hitlDetails",
            json={"chosen_options": [option], "params_input": {}},
        )

    def wait_run(
        self,
        dag_id: str,
        run_id: str,
        *,
        timeout_s: float = 900,
        on_review: Callable[[dict[str, Any]], str | None] | None = None,
        review_delay_s: float = 10.0,
        on_poll: Callable[[list[dict[str, Any]]], None] | None = None,
        poll_s: float = 1.0,
    ) -> str:
        """Wait for a run to end (asked every ``poll_s``: a run's end is seen half of it late, on
        average); returns its state. ``on_review(detail)`` answers each review gate
        (``None`` leaves it open); answers wait ``review_delay_s`` after the gate opened, because
        Airflow 3.3.2 can fail a task answered within a few seconds of its gate opening."""
        deadline = time.monotonic() + timeout_s
        opened: dict[str, float] = {}
        while True:
            state = self.run_state(dag_id, run_id)
            if state in TERMINAL_RUN_STATES:
                return state
            if on_poll is not None:
                on_poll(self.task_instances(dag_id, run_id))
            if on_review is not None:
                for detail in self.pending_reviews(dag_id, run_id):
                    ti = detail["task_instance"]
                    key = f"{ti['task_id']}/{ti['map_index']}"
                    opened.setdefault(key, time.monotonic())
                    if time.monotonic() - opened[key] < review_delay_s:
                        continue
                    option = on_review(detail)
                    if option is not None:
                        self.respond(dag_id, run_id, ti["task_id"], option, ti["map_index"])
            if time.monotonic() > deadline:
                raise TimeoutError(f"DAG run {dag_id}/{run_id} still {state} after {timeout_s:.0f} s")
            time.sleep(poll_s)
