"""The local pool: worker processes on 127.0.0.1, detached, shared by runs through leases.

State lives in ``<state_dir>/<name>/``: ``pool.json`` (one *generation* per spec, with its workers),
``leases-<key>.json`` per generation (who uses it, as :class:`~airflow_batchinfer.worker.leases.PoolState`),
the RPC ``token`` (mode 0600), ``engine-secrets-<key>.json`` per generation whose engine has secret
options set (mode 0600; see :meth:`LocalPool._secrets_file`) and one log per worker. Every change
happens under a file lock.

- A run takes a lease on the generation of its spec (``start(spec, lease_id=...)``). Pools with
  different settings are different generations, side by side: starting one never stops workers that
  a live lease uses (a generation nobody leases is replaced).
- Workers exit by themselves only when idle: no job for ``idle_ttl_s``, no live lease on their
  generation and ``idle_ttl_s`` since its last release or a lease's lapse (each worker reads its
  lease file). A review gate keeps its run's workers unless it gives the lease back (``gate_idle``);
  back-to-back runs reuse warm ones.
- :meth:`LocalPool.keep` (every lane task, every review gate) renews the run's lease, takes it again
  if it lapsed, and restarts workers that died from the stored spec: a crashed worker costs a model
  load, not a shard.

A worker tells the pool it is ready by writing its announcement (``worker-<id>.json``,
:mod:`~airflow_batchinfer.worker.announce`) the moment it serves with its engine loaded; the pool's
wait (:meth:`LocalPool.up`, :func:`~airflow_batchinfer.pools.local_workers.wait_ready`) looks for it
often at first (:func:`~airflow_batchinfer.pools.local_workers.poll_delay`) and asks each worker's
``/v1/ready`` as soon as it has announced, while the others still start.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_batchinfer.engines import SecretOption, check_no_secrets, secret_options
from airflow_batchinfer.engines.models import default_cache_dir
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.pools import local_workers as procs
from airflow_batchinfer.pools.busy import worker_busy
from airflow_batchinfer.pools.one_host import ONE_HOST
from airflow_batchinfer.pools.ref import check_local_name
from airflow_batchinfer.pools.starts import local_starts
from airflow_batchinfer.rpc.client import SyncWorkerClient
from airflow_batchinfer.rpc.locate import Workers
from airflow_batchinfer.state.docs.usage import WorkerStart
from airflow_batchinfer.worker.leases import DEFAULT_LEASE_TTL_S, PoolState
from airflow_batchinfer.worker.settings import POOL_IDLE_TTL_S, worker_argv, worker_default

STATE_VERSION = 2


@dataclass(frozen=True)
class LocalPoolSpec:
    """What a local pool's workers run; each worker setting with the worker's default
    (:mod:`airflow_batchinfer.worker.settings`), passed on as its flag (:meth:`LocalPool._start`)."""

    engine: str = worker_default("engine")
    model: str | None = worker_default("model")
    engine_options: dict[str, Any] = field(default_factory=dict)
    replicas: int = 1
    concurrency: int = worker_default("concurrency")
    idle_ttl_s: float | None = float(POOL_IDLE_TTL_S)  # None: the workers never idle out
    allowed_prefixes: tuple[str, ...] = ()
    target_batch_tokens: int = worker_default("target_batch_tokens")
    python: str = sys.executable  # the interpreter whose `batchinfer` runs the workers
    # callable judges the workers may run ("module:function"), one flag each; none by default
    allowed_callables: tuple[str, ...] = ()
    # LoRA adapter directories the workers may load besides those inside allowed_prefixes
    allowed_adapters: tuple[str, ...] = ()
    # a directory of pre-staged models: the workers load <dir>/<model's directory name> when complete
    model_cache_dir: str | None = worker_default("model_cache_dir")

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ConfigError(f"replicas must be >= 1, got {self.replicas}")
        if not self.allowed_prefixes:
            raise ConfigError("a local pool needs allowed_prefixes: the storage locations its jobs use")
        check_no_secrets(self.engine_options, "engine_options")  # pool.json and argv are not secret
        if isinstance(self.allowed_callables, str) or not all(
            isinstance(e, str) and e and not any(c == "," or c.isspace() for c in e)
            for e in self.allowed_callables
        ):
            raise ConfigError(
                f"allowed_callables: {self.allowed_callables!r}: expected a list of "
                "'package.module:function', without commas or spaces"
            )

    def key(self) -> str:
        """What makes workers interchangeable: everything but the replica count and idle time."""
        data = dataclasses.asdict(self)
        data.pop("replicas")
        data.pop("idle_ttl_s")
        for name in ("allowed_callables", "allowed_adapters", "model_cache_dir"):
            if not data[name]:  # the default: pools from before the field keep their key
                data.pop(name)
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LocalPoolSpec:
        """From ``pool.json``; a file from before a field has its default."""
        return cls(
            **{
                **data,
                "allowed_prefixes": tuple(data.get("allowed_prefixes") or ()),
                "allowed_callables": tuple(data.get("allowed_callables") or ()),
                "allowed_adapters": tuple(data.get("allowed_adapters") or ()),
            }
        )


class LocalPool:
    backend = "local"

    def __init__(
        self,
        name: str = "default",
        *,
        state_dir: str | Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = check_local_name(name)
        self.dir = Path(state_dir or default_cache_dir() / "pools") / name
        self.state_file = self.dir / "pool.json"
        self.clock = clock

    def __str__(self) -> str:
        return f"local://{self.name}"

    # ----------------------------------------------------------------------------------- state
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def _load(self) -> dict[str, Any]:
        try:
            state = dict(json.loads(self.state_file.read_text()))
        except FileNotFoundError:
            state = {}
        if state.get("version") != STATE_VERSION:  # none yet, or a pool from before generations
            old = state.get("spec")
            gens = {state["key"]: {"spec": old, "workers": state.get("workers", [])}} if old else {}
            state = {"version": STATE_VERSION, "current": state.get("key"), "generations": gens}
        return state

    def _save(self, state: dict[str, Any]) -> None:
        _write_atomic(self.state_file, state)

    def _lease_file(self, key: str) -> Path:
        return self.dir / f"leases-{key}.json"

    def _leases(self, key: str, spec: LocalPoolSpec) -> PoolState:
        try:
            state = PoolState.from_dict(json.loads(self._lease_file(key).read_text()))
        except FileNotFoundError:
            state = PoolState(replicas=spec.replicas, idle_ttl_s=0.0, scaledown_ttl_s=0.0)
            state.last_used = self.clock()  # a new generation: the idle clock starts now
        state.idle_ttl_s = float("inf") if spec.idle_ttl_s is None else float(spec.idle_ttl_s)
        return state

    def _save_leases(self, key: str, leases: PoolState) -> None:
        _write_atomic(self._lease_file(key), leases.to_dict())

    def token(self) -> str:
        """The workers' RPC token, written when the pool first started on this host. Reading it
        never makes one: a host without the pool's state (a triggerer or a Celery worker elsewhere)
        is told so, instead of writing a token no worker accepts."""
        try:
            return (self.dir / "token").read_text().strip()
        except FileNotFoundError:
            raise self.not_here() from None

    def _make_token(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            fd = os.open(self.dir / "token", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(32))

    def has_state(self) -> bool:
        """Whether this host holds the pool's state (it was started here)."""
        return self.state_file.exists()

    def not_here(self) -> ConfigError:
        return ConfigError(
            f"{self} has no state on this host ({self.dir}): it was never started here. {ONE_HOST}"
        )

    @staticmethod
    def _live(gen: dict[str, Any]) -> list[dict[str, Any]]:
        return [w for w in gen.get("workers", []) if procs.alive(int(w["pid"]))]

    def _generation(self, state: dict[str, Any], lease_id: str | None) -> tuple[str, dict[str, Any]] | None:
        """The generation ``lease_id`` holds a lease on, else the newest one."""
        gens: dict[str, dict[str, Any]] = state["generations"]
        if lease_id is not None:
            for key, gen in gens.items():
                if lease_id in self._leases(key, LocalPoolSpec.from_dict(gen["spec"])).leases:
                    return key, gen
        current = state.get("current")
        return (current, gens[current]) if current in gens else None

    def _demand(self, gen: dict[str, Any], leases: PoolState) -> int:
        """The workers the generation should have: its largest live lease's demand (a run's tail
        wants fewer than its spec), else the spec's replicas."""
        live = leases.live(self.clock())
        if not live:
            return LocalPoolSpec.from_dict(gen["spec"]).replicas
        return max(lease.replicas for lease in live.values())

    def _ensure(self, gen: dict[str, Any], leases: PoolState) -> int:
        """Start workers until the generation has as many as its largest live lease wants."""
        spec = LocalPoolSpec.from_dict(gen["spec"])
        want = self._demand(gen, leases)
        live = self._live(gen)
        started = [self._start(spec) for _ in range(want - len(live))]
        gen["workers"] = live + started
        return len(started)

    # ------------------------------------------------------------------------------- commands
    def up(self, spec: LocalPoolSpec, *, lease_id: str | None = None, timeout_s: float = 600.0) -> list[str]:
        """Ensure ``spec.replicas`` ready workers; returns their URLs."""
        return self.start(spec, lease_id=lease_id, wait=True, timeout_s=timeout_s)

    def start(
        self,
        spec: LocalPoolSpec,
        *,
        lease_id: str | None = None,
        ttl_s: float = DEFAULT_LEASE_TTL_S,
        wait: bool = False,
        timeout_s: float = 600.0,
    ) -> list[str]:
        """Start (or reuse) the workers of ``spec``, leased for ``lease_id`` when given. Without
        ``wait`` it returns the URLs of workers already listening; :meth:`endpoints` lists each new
        one as soon as it listens (the Airflow setup task waits in a trigger)."""
        key = spec.key()
        with self._locked():
            state = self._load()
            now = self.clock()
            for other, gen in list(state["generations"].items()):
                if other == key:
                    continue
                held = self._leases(other, LocalPoolSpec.from_dict(gen["spec"]))
                if lease_id is not None and held.release(lease_id, now=now):  # one generation per lease
                    self._save_leases(other, held)
                if not held.live(now):
                    procs.stop(self._live(gen), wait=False)  # other settings, unused: replace
                    del state["generations"][other]
                    self._lease_file(other).unlink(missing_ok=True)
                    self._secrets_path(other).unlink(missing_ok=True)
            gen = state["generations"].setdefault(key, {"spec": None, "workers": []})
            gen["spec"] = dataclasses.asdict(spec)
            leases = self._leases(key, spec)
            if lease_id is not None:
                leases.acquire(lease_id, spec.replicas, now=now, ttl_s=ttl_s)
            else:
                leases.last_used = now
            self._ensure(gen, leases)
            state["current"] = key
            self._save_leases(key, leases)
            self._save(state)
            workers = list(gen["workers"])
        if not wait:
            return [w["url"] for w in procs.announced(workers) if w.get("url")]
        return [w["url"] for w in procs.wait_ready(str(self), workers, self.token(), timeout_s)]

    @contextlib.contextmanager
    def _editing(self, lease_id: str | None) -> Iterator[tuple[dict[str, Any], PoolState] | None]:
        """Under the lock: ``lease_id``'s generation (else the newest) and its leases, saved after
        the block; ``None`` when the pool has no generation."""
        with self._locked():
            state = self._load()
            found = self._generation(state, lease_id)
            if found is None:
                yield None
                return
            key, gen = found
            leases = self._leases(key, LocalPoolSpec.from_dict(gen["spec"]))
            yield gen, leases
            self._save_leases(key, leases)
            self._save(state)

    def _never_started(self) -> ConfigError:
        if not self.has_state():
            return self.not_here()
        return ConfigError(
            f"{self} was never started (or was stopped): run the DAG's pool setup task or "
            f"`batchinfer pool up --name {self.name}`"
        )

    def acquire(self, lease_id: str, replicas: int, *, ttl_s: float = DEFAULT_LEASE_TTL_S) -> int:
        """Lease ``lease_id``'s generation (a lease taken again: a gate's answer), else the newest,
        for ``replicas`` workers, expiring ``ttl_s`` from now; returns how many run."""
        with self._editing(lease_id) as found:
            if found is None:
                raise self._never_started()
            gen, leases = found
            leases.acquire(lease_id, replicas, now=self.clock(), ttl_s=ttl_s)
            self._ensure(gen, leases)
            return len(gen["workers"])

    def keep(self, lease_id: str, *, ttl_s: float = DEFAULT_LEASE_TTL_S) -> str | None:
        """Keep ``lease_id``'s workers: renew the lease (take it again if it lapsed) and restart
        workers that died. Returns what had to be repaired, for the log, or ``None``."""
        with self._editing(lease_id) as found:
            if found is None:
                raise self._never_started()
            gen, leases = found
            notes = []
            now = self.clock()
            if lease_id in leases.leases and not leases.renew(lease_id, now=now, ttl_s=ttl_s):
                leases.acquire(lease_id, leases.leases[lease_id].most, now=now, ttl_s=ttl_s)
                notes.append(f"lease {lease_id} had lapsed: taken again")
            if started := self._ensure(gen, leases):
                notes.append(
                    f"{started} workers had exited: restarted from the pool's spec (logs in {self.dir})"
                )
        return "; ".join(notes) or None

    def want(self, lease_id: str, replicas: int | None = None) -> int:
        """Set ``lease_id``'s demand (``None``: its ceiling): workers start up to the generation's
        largest live demand, and idle ones beyond it stop (SIGTERM: a worker drains; one whose
        ``/v1/stats`` shows a job, or that does not answer, is kept). Returns the demand."""
        with self._editing(lease_id) as found:
            if found is None:
                raise self._never_started()
            gen, leases = found
            if not leases.want(lease_id, replicas, now=self.clock()):
                return len(self._live(gen))  # lapsed or released: not this run's to change
            target = self._demand(gen, leases)
            live = self._live(gen)
            if target >= len(live):
                self._ensure(gen, leases)
                return target
            token = self.token()
            idle = [
                w for w in procs.announced(live) if w.get("url") and worker_busy(w["url"], token) is False
            ]
            stopped = idle[: len(live) - target]
            procs.stop(stopped, wait=False)
            gen["workers"] = [w for w in live if w not in stopped]
            return target

    def release(self, lease_id: str, *, stop: bool = False) -> int:
        """Drop ``lease_id``. Its workers stay warm for ``idle_ttl_s`` unless other leases hold them,
        or stop now (``stop``, or ``idle_ttl_s`` 0) when no other run holds them. Returns the
        workers still running."""
        with self._editing(lease_id) as found:
            if found is None:
                return 0
            gen, leases = found
            leases.release(lease_id, now=self.clock())
            live = self._live(gen)
            if (stop or leases.idle_ttl_s == 0) and not leases.live(self.clock()):
                procs.stop(live, wait=False)
                live = []
            return len(live)

    def _start(self, spec: LocalPoolSpec) -> dict[str, Any]:
        wid = secrets.token_hex(4)
        announce = self.dir / f"worker-{wid}.json"
        log = self.dir / f"worker-{wid}.log"
        self._make_token()  # the token file exists before workers read it
        settings: dict[str, Any] = {
            "engine": spec.engine,
            "host": "127.0.0.1",
            "port": 0,
            "concurrency": spec.concurrency,
            "token_file": str(self.dir / "token"),
            "announce_file": str(announce),
            "target_batch_tokens": spec.target_batch_tokens,
            "model": spec.model or None,
            "engine_options": spec.engine_options,
            "allowed_prefixes": spec.allowed_prefixes,
            "allowed_callables": spec.allowed_callables,
            "allowed_adapters": spec.allowed_adapters,
            "model_cache_dir": spec.model_cache_dir,
        }
        if spec.idle_ttl_s is not None:
            settings.update(idle_ttl_s=spec.idle_ttl_s, lease_file=str(self._lease_file(spec.key())))
        if (secrets_file := self._secrets_file(spec)) is not None:
            settings["engine_secrets_file"] = str(secrets_file)  # the path only, never a value
        cmd = [str(Path(spec.python).parent / "batchinfer"), "worker", "serve", *worker_argv(settings)]
        pid = procs.spawn(cmd, log)
        return {
            "id": wid,
            "pid": pid,
            "url": None,
            "announce": str(announce),
            "log": str(log),
            "spawned_at": time.time(),  # the real time, not self.clock: starts() measures with it
        }

    def _secrets_path(self, key: str) -> Path:
        return self.dir / f"engine-secrets-{key}.json"

    def _secrets_file(self, spec: LocalPoolSpec) -> Path | None:
        """The 0600 file of the engine's secret options for ``spec``'s workers. Each one comes from its
        variable (``$OPENAI_API_KEY``...) in the environment of the process that starts workers
        (the pool setup task, ``batchinfer pool up``): the file is rewritten when any is set there,
        else a file written before is kept, so a worker restarted by a task without them gets the
        same. ``None``: the engine takes no secrets, or none was ever set."""
        path = self._secrets_path(spec.key())
        options = secret_options(spec.engine).values()
        values = {o.name: _secret_value(o) for o in options if os.environ.get(o.env)}
        if values:
            _write_private(path, values)
        return path if path.exists() else None

    def status(self) -> dict[str, Any]:
        state = self._load()
        found = self._generation(state, None)
        if found is None:
            return {"name": self.name, "dir": str(self.dir), "spec": None, "workers": []}
        key, gen = found
        spec = LocalPoolSpec.from_dict(gen["spec"])
        out = []
        for w in procs.announced(gen.get("workers", [])):
            entry: dict[str, Any] = {
                "id": w["id"],
                "pid": w["pid"],
                "url": w.get("url"),
                "alive": procs.alive(int(w["pid"])),
            }
            if entry["alive"] and w.get("url"):
                try:
                    with SyncWorkerClient(w["url"], token=self.token(), timeout=5) as client:
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
        others = [k for k in state["generations"] if k != key]
        return {
            "name": self.name,
            "dir": str(self.dir),
            "backend": "local",
            "generation": key,
            "spec": gen["spec"],
            **self._leases(key, spec).describe(self.clock()),
            "workers": out,
            "other_generations": others,
        }

    def endpoints(self, lease_id: str | None = None) -> list[str]:
        """URLs of the live, listening workers of ``lease_id``'s generation (else the newest one);
        a starting worker appears once it announces."""
        found = self._generation(self._load(), lease_id)
        if found is None:
            return []
        return [w["url"] for w in procs.announced(self._live(found[1])) if w.get("url")]

    def workers(self, lease_id: str | None = None) -> Workers:
        """:meth:`endpoints` both ways: a worker process that lives is listed, a paused one too, and
        one that exited runs nothing (a restarted one listens on another port)."""
        return Workers.of(self.endpoints(lease_id))

    def starts(self, since: float) -> list[WorkerStart]:
        """The workers of every generation spawned since ``since``, with their start marks (from
        their announcements: imports done, model loaded, announced)."""
        workers = [w for gen in self._load()["generations"].values() for w in gen.get("workers", [])]
        return local_starts(workers, since, procs.startups(workers))

    def problems(self) -> list[str]:
        """Why workers are missing: the ones that exited, with the end of their logs."""
        found = self._generation(self._load(), None)
        if found is None:
            return [str(self._never_started())]
        return [
            f"worker {w['id']} (pid {w['pid']}) exited; {w['log']} ends:\n{procs.log_tail(w['log'], 600)}"
            for w in found[1].get("workers", [])
            if not procs.alive(int(w["pid"]))
        ]

    def down(self, *, wait: bool = True) -> int:
        """Stop every worker of every generation now (leases included)."""
        with self._locked():
            state = self._load()
            live = [w for gen in state["generations"].values() for w in self._live(gen)]
            procs.stop(live, wait=wait)
            for key in state["generations"]:
                self._lease_file(key).unlink(missing_ok=True)
                self._secrets_path(key).unlink(missing_ok=True)
            self._save({"version": STATE_VERSION, "current": None, "generations": {}})
            return len(live)


def _write_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def _write_private(path: Path, data: dict[str, Any]) -> None:
    """``data`` as JSON in ``path``, mode 0600 from its creation on (never briefly readable)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _secret_value(option: SecretOption) -> Any:
    """``option``'s value from its variable: text, or JSON for ``is_json`` options."""
    text = os.environ[option.env]
    if not option.is_json:
        return text
    try:
        return json.loads(text)
    except ValueError:
        raise ConfigError(
            f"${option.env} (the engine option {option.name}) is not JSON; the value is "
            "not shown. Remedy: set it to a JSON object"
        ) from None
