"""A ``worker_pool`` reference, parsed once, and the interface every pool backend offers.

A DAG (or the CLI) names its pool with one string:

- ``local://NAME``: the local pool ``NAME`` on this host (the embedded default);
- ``kubernetes://NAMESPACE/NAME[?kubernetes_conn_id=ID]``: a worker Deployment;
- anything else: the id of a ``batchinfer_pool`` connection, whose host lists worker URLs (a static
  pool, token in the password) or whose extra says ``backend: local`` (``local_pool``) or
  ``backend: kubernetes`` (``namespace``, ``pool``, ``kubernetes_conn_id``, and who may call its
  workers: ``rpc_from``, ``rpc_from_namespace``, see
  :class:`~airflow_batchinfer.pools.kubernetes.spec.RpcPeers`).

:meth:`PoolRef.parse` turns the string into a :class:`PoolRef` (no secrets: safe in trigger
arguments and logs); :func:`~airflow_batchinfer.pools.backends.open_backend` turns that into a
:class:`WorkerPool`; it sits above the backends (the local pool imports this module, this module
only the Kubernetes pool's spec values). Connections and Kubernetes credentials come from the
caller (``airflow_batchinfer.hooks.pool`` on the Airflow side), so nothing here imports Airflow.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol
from urllib.parse import parse_qs, urlsplit

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.pools.kubernetes.spec import RpcPeers
from airflow_batchinfer.rpc.locate import Workers
from airflow_batchinfer.state.docs.usage import WorkerStart

LOCAL = "local://"
KUBERNETES = "kubernetes://"


class WorkerPool(Protocol):
    """What the Airflow layer and the CLI need from any pool. A *lease* is one run's claim on the
    pool (``DAG/RUN``): it keeps the workers up while the run lives, however long its reviews take."""

    backend: str

    def endpoints(self, lease_id: str | None = None) -> list[str]:
        """The URLs of the workers that answer now (of ``lease_id``'s workers, where that differs)."""
        ...

    def workers(self, lease_id: str | None = None) -> Workers:
        """The workers to submit to (:meth:`endpoints`) and those that may still run a job they
        took (a job is looked for on these before a copy starts; see
        :class:`~airflow_batchinfer.rpc.locate.Workers`)."""
        ...

    def token(self) -> str | None: ...

    def acquire(self, lease_id: str, replicas: int, *, ttl_s: float = ...) -> int: ...

    def keep(self, lease_id: str, *, ttl_s: float = ...) -> str | None:
        """Renew the lease and repair what the backend can (restart dead local workers); returns a
        note for the log when something had to be repaired or could not be."""
        ...

    def want(self, lease_id: str, replicas: int | None = None) -> int:
        """Set the run's demand now (``None``: what its setup asked for; clamped to that): fewer as a
        round's lanes end (:func:`~airflow_batchinfer.pools.tail.tail_replicas`), all back when a
        round starts. Idle workers beyond the largest demand stop (never one with a running job);
        returns the replicas the pool targets."""
        ...

    def release(self, lease_id: str, *, stop: bool = False) -> int:
        """Drop the lease; the workers stay warm for ``idle_ttl_s``, or stop now with ``stop`` unless
        another run holds them. Returns the workers still running."""
        ...

    def problems(self) -> list[str]:
        """Why workers are missing, in the backend's words (for error messages)."""
        ...

    def starts(self, since: float) -> list[WorkerStart]:
        """Each worker started since ``since`` (Unix time) with its marks in seconds from it:
        scheduled, started, model loaded, ready (:mod:`~airflow_batchinfer.pools.starts`); ``[]``
        where the backend starts none."""
        ...


class ConnectionLike(Protocol):
    """The fields of an Airflow connection a pool reads."""

    conn_id: str
    host: str | None
    password: str | None

    @property
    def extra_dejson(self) -> Mapping[str, Any]: ...


# Returns a Kubernetes API client for a cncf.kubernetes connection id (``None``: the default
# kubeconfig or in-cluster account).
KubernetesApi = Callable[[str | None], Any]


@dataclass(frozen=True)
class PoolRef:
    backend: Literal["local", "kubernetes", "connection"]
    name: str  # the local pool, the Deployment, or the connection id
    namespace: str | None = None
    kubernetes_conn_id: str | None = None
    # a Kubernetes pool's connection may name who may call its workers (resolve() reads them)
    peers: RpcPeers = field(default_factory=RpcPeers)

    @classmethod
    def parse(cls, worker_pool: str) -> PoolRef:
        text = str(worker_pool).strip()
        if not text:
            raise ConfigError(
                "worker_pool is empty: name a local://NAME pool, a kubernetes:// pool or a connection"
            )
        if text.startswith(LOCAL):
            return cls("local", check_local_name(text[len(LOCAL) :]))
        if text.startswith(KUBERNETES):
            parts = urlsplit(text)
            path = [p for p in parts.path.split("/") if p]
            if not parts.netloc or len(path) != 1:
                raise ConfigError(f"{text!r}: write a Kubernetes pool as kubernetes://NAMESPACE/NAME")
            conn = parse_qs(parts.query).get("kubernetes_conn_id", [None])[0]
            return cls("kubernetes", path[0], parts.netloc, conn)
        if "://" in text:
            raise ConfigError(
                f"{text!r}: worker_pool is local://NAME, kubernetes://NAMESPACE/NAME or a connection id"
            )
        return cls("connection", text)

    def __str__(self) -> str:
        if self.backend == "local":
            return LOCAL + self.name
        if self.backend == "kubernetes":
            query = f"?kubernetes_conn_id={self.kubernetes_conn_id}" if self.kubernetes_conn_id else ""
            return f"{KUBERNETES}{self.namespace}/{self.name}{query}"
        return self.name

    def resolve(self, connection: ConnectionLike | None = None) -> PoolRef:
        """For a connection: the local or Kubernetes pool its extra names (``self`` otherwise, and
        for a static connection). A Kubernetes pool's ``rpc_from``/``rpc_from_namespace`` are parsed
        and checked here, once (:attr:`peers`; the pool
        :func:`~airflow_batchinfer.pools.backends.open_backend` returns carries them)."""
        if self.backend != "connection":
            return self
        if connection is None:
            raise ConfigError(f"pool {self.name!r} is a connection: look it up first")
        extra = dict(connection.extra_dejson or {})
        backend = extra.get("backend")
        if backend == "kubernetes":
            if not extra.get("pool"):
                raise ConfigError(
                    f"connection {self.name!r}: the kubernetes backend needs extra.pool (and namespace)"
                )
            return PoolRef(
                "kubernetes",
                str(extra["pool"]),
                str(extra.get("namespace") or "default"),
                extra.get("kubernetes_conn_id") or None,
                RpcPeers.from_mapping(extra, f"connection {self.name!r} extra"),
            )
        if backend == "local":
            if not extra.get("local_pool"):
                raise ConfigError(f"connection {self.name!r}: the local backend needs extra.local_pool")
            return PoolRef("local", str(extra["local_pool"]))
        if backend not in (None, "", "static"):
            raise ConfigError(
                f"connection {self.name!r}: extra.backend {backend!r} is not local, kubernetes or static"
            )
        return self

    @property
    def needs_connection(self) -> bool:
        return self.backend == "connection"


def check_local_name(name: str) -> str:
    """``name`` if a local pool may be called so (it names the pool's state directory)."""
    if not name.replace("-", "").replace("_", "").isalnum():
        raise ConfigError(f"pool name {name!r}: use letters, digits, '-' and '_'")
    return name


def require_endpoints(pool: WorkerPool, lease_id: str | None = None) -> list[str]:
    """The pool's worker URLs, or a :class:`ConfigError` with what is wrong and the remedy."""
    urls = pool.endpoints(lease_id)
    if urls:
        return urls
    why = "; ".join(pool.problems()[:3])
    raise ConfigError(
        f"worker pool {pool} has no live workers{f' ({why})' if why else ''}: run the DAG's pool setup "
        "task (or `batchinfer pool up`), or check the connection's worker URLs"
    )
