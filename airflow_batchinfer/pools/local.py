"""The local pool: N worker processes on 127.0.0.1, detached, reused across runs.

State lives in ``<state_dir>/<name>/``: ``pool.json`` (spec and workers), the RPC ``token`` (mode
0600), and one log per worker. ``up()`` keeps live workers whose spec matches, replaces the rest,
starts what is missing and waits until all are ready. Workers exit by themselves after
``idle_ttl_s`` without jobs, so back-to-back runs reuse warm workers and nothing lingers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_batchinfer.exceptions import ConfigError, WorkerUnavailable
from airflow_batchinfer.models import default_cache_dir
from airflow_batchinfer.rpc.client import SyncWorkerClient


@dataclass(frozen=True)
class LocalPoolSpec:
    engine: str = "simulated"
    model: str | None = None
    engine_options: dict[str, Any] = field(default_factory=dict)
    replicas: int = 1
    concurrency: int = 4
    idle_ttl_s: float | None = 600.0
    allowed_prefixes: tuple[str, ...] = ()
    target_batch_tokens: int = 16_384
    python: str = sys.executable  # the interpreter whose `batchinfer` runs the workers

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ConfigError(f"replicas must be >= 1, got {self.replicas}")
        if not self.allowed_prefixes:
            raise ConfigError("a local pool needs allowed_prefixes: the storage locations its jobs use")

    def key(self) -> str:
        data = dataclasses.asdict(self)
        data.pop("replicas")
        data.pop("idle_ttl_s")
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


# Workers this process started: kept so they are reaped (not left as zombies) once they exit.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def _alive(pid: int) -> bool:
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


class LocalPool:
    def __init__(self, name: str = "default", *, state_dir: str | Path | None = None) -> None:
        if not name.replace("-", "").replace("_", "").isalnum():
            raise ConfigError(f"pool name {name!r}: use letters, digits, '-' and '_'")
        self.name = name
        self.dir = Path(state_dir or default_cache_dir() / "pools") / name
        self.state_file = self.dir / "pool.json"

    # ----------------------------------------------------------------------------------- state
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _load(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.state_file.read_text()))
        except FileNotFoundError:
            return {"workers": []}

    def _save(self, state: dict[str, Any]) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        os.replace(tmp, self.state_file)

    @property
    def token(self) -> str:
        path = self.dir / "token"
        if not path.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(32))
        return path.read_text().strip()

    def _live(self, state: dict[str, Any]) -> list[dict[str, Any]]:
        return [w for w in state.get("workers", []) if _alive(int(w["pid"]))]

    # ------------------------------------------------------------------------------- commands
    def up(self, spec: LocalPoolSpec, *, timeout_s: float = 600.0) -> list[str]:
        """Ensure ``spec.replicas`` ready workers; returns their URLs."""
        return self.start(spec, wait=True, timeout_s=timeout_s)

    def start(self, spec: LocalPoolSpec, *, wait: bool = False, timeout_s: float = 600.0) -> list[str]:
        """Like :meth:`up`; without ``wait`` it returns once the workers are started, and
        :meth:`urls` lists each one as soon as it listens (the Airflow setup task waits in a trigger)."""
        with self._locked():
            state = self._load()
            live = self._live(state)
            if state.get("key") not in (None, spec.key()):
                self._stop([w for w in live], wait=True)  # different model or settings: replace
                live = []
            keep, extra = live[: spec.replicas], live[spec.replicas :]
            self._stop(extra, wait=False)
            started = [self._start(spec) for _ in range(spec.replicas - len(keep))]
            state = {"key": spec.key(), "spec": dataclasses.asdict(spec), "workers": keep + started}
            self._save(state)
            if not wait:
                return [w["url"] for w in keep]
            workers = self._wait_ready(state["workers"], timeout_s)
            state["workers"] = workers
            self._save(state)
            return [w["url"] for w in workers]

    def _start(self, spec: LocalPoolSpec) -> dict[str, Any]:
        wid = secrets.token_hex(4)
        announce = self.dir / f"worker-{wid}.json"
        log = self.dir / f"worker-{wid}.log"
        self.token  # noqa: B018 - make sure the token file exists before workers read it
        cmd = [
            str(Path(spec.python).parent / "batchinfer"),
            "worker",
            "serve",
            "--engine",
            spec.engine,
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--concurrency",
            str(spec.concurrency),
            "--token-file",
            str(self.dir / "token"),
            "--announce-file",
            str(announce),
            "--target-batch-tokens",
            str(spec.target_batch_tokens),
        ]
        if spec.model:
            cmd += ["--model", spec.model]
        for key, value in spec.engine_options.items():
            cmd += ["--engine-arg", f"{key}={json.dumps(value) if not isinstance(value, str) else value}"]
        for prefix in spec.allowed_prefixes:
            cmd += ["--allow-prefix", prefix]
        if spec.idle_ttl_s is not None:
            cmd += ["--idle-ttl", str(spec.idle_ttl_s)]
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
            )
        _CHILDREN[proc.pid] = proc
        return {"id": wid, "pid": proc.pid, "url": None, "announce": str(announce), "log": str(log)}

    def _wait_ready(self, workers: list[dict[str, Any]], timeout_s: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        pending = [w for w in workers if not w.get("url")]
        while pending:
            for w in list(pending):
                announce = Path(w["announce"])
                if announce.exists():
                    w["url"] = json.loads(announce.read_text())["url"]
                    pending.remove(w)
                elif not _alive(int(w["pid"])):
                    tail = Path(w["log"]).read_text(errors="replace")[-3000:]
                    raise WorkerUnavailable(
                        f"local worker {w['id']} exited while starting; log {w['log']}:\n{tail}"
                    )
            if pending and time.monotonic() > deadline:
                raise WorkerUnavailable(f"{len(pending)} local workers not ready after {timeout_s:.0f} s")
            time.sleep(0.1)
        for w in workers:
            with SyncWorkerClient(w["url"], token=self.token) as client:
                if not client.ready():
                    raise WorkerUnavailable(f"local worker {w['url']} is not ready; see {w['log']}")
        return workers

    def status(self) -> dict[str, Any]:
        state = self._load()
        out = []
        for w in self._announced(state.get("workers", [])):
            entry: dict[str, Any] = {
                "id": w["id"],
                "pid": w["pid"],
                "url": w.get("url"),
                "alive": _alive(int(w["pid"])),
            }
            if entry["alive"] and w.get("url"):
                try:
                    with SyncWorkerClient(w["url"], token=self.token, timeout=5) as client:
                        stats, ready = client.stats(), client.ready()
                    entry.update(
                        ready=ready,
                        slots_busy=stats.slots_busy,
                        slots_total=stats.slots_total,
                        jobs=stats.jobs,
                        utilization=round(stats.batcher.get("utilization", 0.0), 3),
                    )
                except Exception as exc:
                    entry["error"] = str(exc)
            out.append(entry)
        return {"name": self.name, "dir": str(self.dir), "spec": state.get("spec"), "workers": out}

    @staticmethod
    def _announced(workers: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Fill in the URL of workers started without waiting, once they have announced it."""
        for w in workers:
            if not w.get("url") and w.get("announce") and Path(w["announce"]).exists():
                with contextlib.suppress(ValueError, OSError):
                    w["url"] = json.loads(Path(w["announce"]).read_text())["url"]
        return workers

    def urls(self) -> list[str]:
        """URLs of the live workers that listen (a starting worker appears once it announces)."""
        return [w["url"] for w in self._announced(self._live(self._load())) if w.get("url")]

    def down(self, *, wait: bool = True) -> int:
        with self._locked():
            live = self._live(self._load())
            self._stop(live, wait=wait)
            self._save({"workers": []})
            return len(live)

    @staticmethod
    def _stop(workers: list[dict[str, Any]], *, wait: bool, timeout_s: float = 60.0) -> None:
        for w in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(w["pid"]), signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while wait and any(_alive(int(w["pid"])) for w in workers):
            if time.monotonic() > deadline:
                for w in workers:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(w["pid"]), signal.SIGKILL)
                break
            time.sleep(0.1)
