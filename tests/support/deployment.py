"""Airflow as users deploy it, on this machine, for ``tests/system/deployment/``.

PostgreSQL (Debian's ``postgresql``, a cluster in a temporary directory, run as the ``postgres``
user since it refuses root) is the metadata database; Redis (Debian's ``redis-server``) is the Celery
broker; the FAB auth manager signs people in. An api-server, a scheduler, a dag-processor, two
triggerers and two Celery workers each run as on a host of their own: their own ``HOME``,
``AIRFLOW_HOME``, working directory, ``BATCHINFER_CACHE``, log folder and copy of the DAGs, sharing
nothing on local disk (run roots live on the S3 server; connections and pools are made in the
database). Everything listens on 127.0.0.1 and is stopped by PID.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_batchinfer.dev.airflow import free_port
from airflow_batchinfer.dev.local_airflow import LocalAirflow
from tests.support.proxy import RoundRobinProxy
from tests.support.workers import WorkerProcess

FAB = "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"
REPO = Path(__file__).resolve().parents[2]
HOST_ENV = "BATCHINFER_TEST_HOST"


def component_host() -> str:
    """Airflow's ``[core] hostname_callable`` here: each component names its own host, as on
    separate machines (the jobs table and task instances then say which component ran what)."""
    return os.environ.get(HOST_ENV) or "cli"


NEEDS = "the deployment tier needs Debian's postgresql and redis-server packages (make services)"


def postgres_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return found[-1].parent if found else None


def missing() -> str | None:
    """Why the tier cannot run here, or ``None``."""
    if postgres_bin() is None or shutil.which("redis-server") is None:
        return NEEDS
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "PostgreSQL refuses to run as root, and runuser is missing"
    return None


@dataclass
class Postgres:
    """A PostgreSQL cluster of its own on 127.0.0.1: ``url()`` is Airflow's connection string."""

    dir: Path
    port: int
    password: str = field(default_factory=lambda: secrets.token_hex(12))

    def _as_owner(self, *argv: str) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else list(argv)

    def start(self) -> Postgres:
        bin_dir = postgres_bin()
        assert bin_dir is not None, NEEDS
        self.dir.mkdir(parents=True, exist_ok=True)
        pw = self.dir / "pw"
        pw.write_text(self.password)
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
            shutil.chown(pw, "postgres")
        data = self.dir / "data"
        subprocess.run(
            self._as_owner(
                str(bin_dir / "initdb"),
                "-D",
                str(data),
                "-U",
                "airflow",
                f"--pwfile={pw}",
                "--auth=scram-sha-256",
                "-E",
                "UTF8",
            ),
            check=True,
            capture_output=True,
            timeout=120,
        )
        options = (
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=off"
        )
        subprocess.run(
            self._as_owner(
                str(bin_dir / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(self.dir / "log"),
                "-o",
                options,
                "-w",
                "start",
            ),
            check=True,
            capture_output=True,
            timeout=120,
        )
        subprocess.run(
            [str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "airflow", "airflow"],
            env={**os.environ, "PGPASSWORD": self.password},
            check=True,
            capture_output=True,
            timeout=60,
        )
        return self

    def url(self, scheme: str = "postgresql+psycopg2") -> str:
        return f"{scheme}://airflow:{self.password}@127.0.0.1:{self.port}/airflow"

    def stop(self) -> None:
        bin_dir = postgres_bin()
        if bin_dir is not None and (self.dir / "data" / "postmaster.pid").exists():
            subprocess.run(
                self._as_owner(
                    str(bin_dir / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "immediate", "stop"
                ),
                capture_output=True,
                timeout=60,
            )
        shutil.rmtree(self.dir, ignore_errors=True)


@dataclass
class Redis:
    dir: Path
    port: int
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> Redis:
        self.dir.mkdir(parents=True, exist_ok=True)
        log = open(self.dir / "redis.log", "ab")  # noqa: SIM115 - the child keeps it
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + 30
        while "Ready to accept connections" not in (self.dir / "redis.log").read_text(errors="replace"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"redis-server did not start: {(self.dir / 'redis.log').read_text()[-2000:]}"
                )
            time.sleep(0.1)
        return self

    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


TRIGGERERS = ("triggerer-1", "triggerer-2")
CELERY_WORKERS = ("celery-1", "celery-2")


def deployment_components(celery_concurrency: int) -> dict[str, list[str]]:
    celery = [
        "celery",
        "worker",
        "--concurrency",
        str(celery_concurrency),
        "--skip-serve-logs",
        "--without-gossip",
        "--without-mingle",
    ]
    return {
        "api-server": ["api-server", "--workers", "1"],
        "scheduler": ["scheduler", "--skip-serve-logs"],
        "dag-processor": ["dag-processor"],
        **{t: ["triggerer", "--skip-serve-logs"] for t in TRIGGERERS},
        **{w: [*celery, "--celery-hostname", f"{w}@%h"] for w in CELERY_WORKERS},
    }


@dataclass
class DeployedAirflow(LocalAirflow):
    """:class:`LocalAirflow`'s REST API and lifecycle over the production-shaped topology. ``home`` holds
    one folder per component (its host) and this harness's own logs; ``env`` is given to every
    component. The admin signs in as ``username``; :meth:`add_user` makes more people."""

    postgres: Postgres | None = None
    redis: Redis | None = None
    celery_concurrency: int = 4
    users: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.components = deployment_components(self.celery_concurrency)

    def host(self, component: str) -> Path:
        """The folder that stands for ``component``'s host (``cli``: where CLI commands run)."""
        return self.home / "hosts" / component

    def workdir(self, component: str) -> Path | None:
        return self.host(component) / "work"

    def environ(self, component: str | None = None) -> dict[str, str]:
        assert self.postgres is not None and self.redis is not None, "start postgres and redis first"
        host = self.host(component or "cli")
        airflow_home = host / "airflow"
        env = super().environ(component)
        env.update(
            {
                "HOME": str(host),
                "AIRFLOW_HOME": str(airflow_home),
                "BATCHINFER_CACHE": str(host / "cache"),
                "AIRFLOW__CORE__DAGS_FOLDER": str(host / "dags"),
                "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
                "AIRFLOW__CORE__AUTH_MANAGER": FAB,
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.postgres.url(),
                "AIRFLOW__CELERY__BROKER_URL": self.redis.url(),
                "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + self.postgres.url(),
                "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(self.celery_concurrency),
                "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(airflow_home / "logs"),
                "AIRFLOW__FAB__SESSION_BACKEND": "securecookie",
                "AIRFLOW__CORE__HOSTNAME_CALLABLE": f"{__name__}.component_host",
                HOST_ENV: component or "cli",
                "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
            }
        )
        for name in (
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE",
        ):
            env.pop(name, None)
        return {**env, **self.env}

    def _lay_out_hosts(self) -> None:
        for component in (*self.components, "cli"):
            host = self.host(component)
            for sub in ("airflow", "cache", "work"):
                (host / sub).mkdir(parents=True, exist_ok=True)
            shutil.rmtree(host / "dags", ignore_errors=True)
            shutil.copytree(self.dags_folder, host / "dags", ignore=shutil.ignore_patterns("__pycache__"))

    def _prepare(self) -> None:
        """Every host's folders and DAGs, the database (FAB's tables too) and the admin."""
        self._lay_out_hosts()
        self.airflow("db", "migrate")
        self.airflow("fab-db", "migrate")
        self._create_user(self.username, self.password, "Admin")

    def _create_user(self, username: str, password: str, role: str) -> None:
        self.airflow(
            "users",
            "create",
            "--username",
            username,
            f"--password={password}",  # one argument: a password may start with "-" (token_urlsafe)
            "--role",
            role,
            "--firstname",
            username.title(),
            "--lastname",
            "Tester",
            "--email",
            f"{username}@example.org",
        )

    def add_user(self, username: str, role: str) -> str:
        """A FAB user with ``role`` (a built-in role or one made with :meth:`add_role`); returns the
        password."""
        password = secrets.token_urlsafe(12)
        self._create_user(username, password, role)
        self.users[username] = password
        return password

    def add_role(self, role: str, permissions: dict[str, list[str]]) -> None:
        """A FAB role holding ``{resource: [action, ...]}``."""
        self.airflow("roles", "create", role)
        for resource, actions in permissions.items():
            self.airflow("roles", "add-perms", role, "-r", resource, "-a", *actions)

    def token_for(self, username: str) -> str:
        import httpx

        r = httpx.post(
            f"{self.url}/auth/token",
            json={"username": username, "password": self.users[username]},
            timeout=30,
        )
        r.raise_for_status()
        return str(r.json()["access_token"])

    def _worker_logs(self, worker: str) -> LocalAirflow:
        """The log folder of one Celery worker's host (its ``AIRFLOW_HOME``)."""
        return LocalAirflow(home=self.host(worker) / "airflow", dags_folder=self.dags_folder)

    def task_log(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> str:
        """Every attempt's log of a task instance, oldest first, from whichever worker host ran it."""
        logs = []
        for worker in CELERY_WORKERS:
            if text := self._worker_logs(worker).task_log(dag_id, run_id, task_id, map_index):
                logs.append(f"--- on {worker}:\n{text}")
        return "\n".join(logs)

    def ran_on(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> dict[str, list[int]]:
        """Which Celery worker host ran which tries of a task instance (from their log folders)."""
        found = {
            w: list(self._worker_logs(w).attempt_logs(dag_id, run_id, task_id, map_index))
            for w in CELERY_WORKERS
        }
        return {w: tries for w, tries in found.items() if tries}

    def triggerer_of(self, ti: dict[str, Any]) -> str | None:
        """The triggerer component that runs a deferred task instance's trigger (a REST task instance:
        its trigger's ``triggerer_id`` is a job of the jobs table, whose hostname names the component)."""
        job = (ti.get("trigger") or {}).get("triggerer_id")
        if job is None:
            return None
        jobs = self.api("GET", "/jobs", params={"job_type": "TriggererJob", "limit": 100})["jobs"]
        return next((j["hostname"] for j in jobs if j["id"] == job), None)

    def component_of(self, pid: int) -> str | None:
        """The component whose process tree holds ``pid``."""
        parents = self.descendants()
        roots = {p.pid: name for name, p in self.procs.items()}
        while pid not in roots:
            if pid not in parents:
                return None
            pid = parents[pid]
        return roots[pid]

    def stop(self, timeout_s: float = 30) -> None:
        try:
            super().stop(timeout_s)
        finally:
            for service in (self.redis, self.postgres):
                if service is not None:
                    with contextlib.suppress(Exception):
                        service.stop()


def start_deployment(
    home: Path,
    dags_folder: Path,
    *,
    env: dict[str, str],
    failure_timeout_s: int = 10,
    pools: dict[str, int] | None = None,
    **kw: Any,
) -> DeployedAirflow:
    """PostgreSQL, Redis and the seven Airflow components; stops what it started if any fails."""
    # PostgreSQL runs as its own user, who cannot enter pytest's root-only temp folders
    pg_dir = Path(tempfile.mkdtemp(prefix="bi-pg-"))
    af = DeployedAirflow(
        home=home, dags_folder=dags_folder, env=env, failure_timeout_s=failure_timeout_s, **kw
    )
    af.postgres = Postgres(pg_dir, free_port())  # before start: a failed start is stopped too
    af.redis = Redis(home / "redis", free_port())
    try:
        af.postgres.start()
        af.redis.start()
        af.start(pools=pools)
    except BaseException:
        af.stop()
        raise
    return af


def kill_component(af: DeployedAirflow, component: str) -> int:
    """SIGKILL one component's whole process group (a lost host); returns its PID."""
    pid = af.pid(component)
    af.kill(component, signal.SIGKILL, group=True)
    return pid


BUCKET = "batchinfer-deploy"
FAILURE_TIMEOUT_S = 15


@dataclass
class StaticPools:
    fast: list[WorkerProcess]
    slow: list[WorkerProcess]
    shared: RoundRobinProxy  # one address in front of the fast pool's workers
