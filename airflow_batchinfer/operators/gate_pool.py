"""The run's pool around a review gate: what the gate's opening does with the run's lease and
workers (the ``gate_idle`` run setting, decided by :func:`~airflow_batchinfer.run.gate.idle.gate_idle`)
and what its answer does to get them back
(:func:`~airflow_batchinfer.run.gate.idle.answer_action`), with the run's usage events (best effort:
a failed usage write is logged, never fails the task).

The round controller calls :func:`open_gate` before it waits and :func:`answer_gate` after the
answer; when the pool must re-warm, the controller defers on
:class:`~airflow_batchinfer.triggers.pool_ready.PoolReadyTrigger` (no worker slot held while the
workers start).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from airflow.sdk import Context

from airflow_batchinfer.compat import AirflowFailException
from airflow_batchinfer.exceptions import BatchInferError, ConfigError
from airflow_batchinfer.hooks.pool import open_pool
from airflow_batchinfer.operators.pool import lease_id
from airflow_batchinfer.pools import WorkerPool
from airflow_batchinfer.rpc.client import SyncWorkerClient
from airflow_batchinfer.run.gate.idle import SLEEP_LEVEL, GateIdle, answer_action, gate_idle, gate_refusal
from airflow_batchinfer.run.usage_events import record_event
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs.plan import Plan, read_plan, slots
from airflow_batchinfer.state.docs.usage import UsageEvent, WorkerStart, read_usage
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage.location import StorageOptions
from airflow_batchinfer.triggers import SETTLE_S
from airflow_batchinfer.triggers.pool_ready import PoolReadyTrigger, observe_pool, pool_readiness, why_refused
from airflow_batchinfer.worker.leases import DEFAULT_LEASE_TTL_S


def as_replicas(value: int | str | None) -> int | None:
    """The controller's templated ``replicas`` (``None``: not given)."""
    return None if value in (None, "", "None") else int(str(value))


def warm_trigger(worker_pool: str, replicas: int, lease: str, timeout_s: float) -> PoolReadyTrigger:
    """What the answer waits on, deferred, while the pool re-warms: re-created from its arguments
    if the triggerer restarts."""
    now = time.time()
    return PoolReadyTrigger(
        worker_pool=worker_pool,
        replicas=replicas,
        deadline=now + timeout_s,
        lease_id=lease,
        not_before=now + SETTLE_S,
        keep_s=DEFAULT_LEASE_TTL_S,
    )


@dataclass(frozen=True)
class PoolView:
    """What a pool says of its leases: the live ones by id (``None``: the backend does not say) and
    its ``idle_ttl_s``."""

    leases: dict[str, Any] | None = None
    idle_ttl_s: float | None = None


def view(pool: WorkerPool, log: Any) -> PoolView:
    """The pool's leases, from its ``status()`` where it has one (local, Kubernetes)."""
    status: Callable[[], dict[str, Any]] | None = getattr(pool, "status", None)
    if status is None:
        return PoolView()
    try:
        found = status()
    except Exception as exc:  # what the gate says is less precise; the gate still opens
        log.warning("worker pool %s: its leases not read (%s)", pool, exc)
        return PoolView()
    ttl = found.get("idle_ttl_s")
    return PoolView(dict(found.get("leases") or {}), None if ttl is None else float(ttl))


def last_warm_s(layout: RunLayout, so: StorageOptions | None) -> float | None:
    """How long the run's last pool (re)start took (its last ``warm`` event), if it had one."""
    try:
        warm = [e for e in read_usage(layout, so) if e.kind == "warm" and e.requested_at is not None]
    except (BatchInferError, OSError):
        return None
    return warm[-1].at - warm[-1].requested_at if warm and warm[-1].requested_at else None


def _each_worker(
    pool: WorkerPool, lease: str, what: str, call: Callable[[SyncWorkerClient], Any], log: Any
) -> int:
    """``call`` on each of the lease's workers at once (best effort: a worker that fails it is
    logged); returns how many took it."""
    token = pool.token()

    def one(url: str) -> bool:
        try:
            with SyncWorkerClient(url, token=token, timeout=10) as client:
                call(client)
            return True
        except (BatchInferError, OSError) as exc:
            log.warning("worker %s: %s failed (%s)", url, what, exc)
            return False

    urls = pool.endpoints(lease)
    with ThreadPoolExecutor(max_workers=min(32, len(urls) or 1)) as ex:
        return sum(ex.map(one, urls))


def _asleep(pool: WorkerPool, lease: str) -> bool:
    token = pool.token()
    for url in pool.endpoints(lease):
        try:
            with SyncWorkerClient(url, token=token, timeout=10) as client:
                if client.stats().sleeping:
                    return True
        except (BatchInferError, OSError):
            continue
    return False


def sleep_refusal(pool: WorkerPool, lease: str) -> str | None:
    """Why the pool's engine cannot sleep, as its first worker that answers says (``None``: it can,
    or no worker answered: the gate's sleep then logs each worker that refuses)."""
    token = pool.token()
    for url in pool.endpoints(lease):
        try:
            with SyncWorkerClient(url, token=token, timeout=10) as client:
                return client.stats().sleep_refusal
        except (BatchInferError, OSError):
            continue
    return None


def gate_start_refusal(running: RunConfig, pool: WorkerPool, lease: str) -> str | None:
    """Why the run's ``gate_idle`` cannot hold on its pool (asked at a round's start, before any
    gate; a run that never opens one is not refused): a static pool released or put to sleep, an
    engine that cannot sleep (the ``sleep_refusal`` its workers' stats give)."""
    if running.reviews.review == "never" and not running.human_review:
        return None
    policy = running.reviews.gate_idle
    return gate_refusal(policy, pool.backend, sleep_refusal(pool, lease) if policy == "sleep" else None)


def open_gate(
    worker_pool: str,
    cfg: RunConfig,
    context: Context,
    log: Any,
    *,
    replicas: int,
    response_timeout_s: float | None,
    slot: str,
    so: StorageOptions | None,
) -> GateIdle:
    """Apply ``gate_idle`` to the run's pool as its gate opens (the pool's lease was renewed for the
    whole wait just before: ``keep``): ``release`` sets the lease's expiry ``gate_keep_warm_s`` from
    now, ``sleep`` asks each worker to sleep once idle that long. Records ``gate_open``."""
    pool, lease, layout = open_pool(worker_pool), lease_id(context), RunLayout(cfg.run_root)
    seen = view(pool, log)
    others = None if seen.leases is None else len(set(seen.leases) - {lease})
    try:
        idle = gate_idle(
            cfg.reviews.gate_idle,
            backend=pool.backend,
            keep_warm_s=cfg.reviews.gate_keep_warm_s,
            response_timeout_s=response_timeout_s,
            other_leases=others,
            idle_ttl_s=seen.idle_ttl_s,
            last_warm_s=last_warm_s(layout, so),
        )
    except ConfigError as exc:  # refused at the round's start already, unless a review changed it
        raise AirflowFailException(f"bad run settings: {exc}") from exc
    held = replicas
    if idle.action == "release":
        # acquire sets the expiry (a renewal only pushes it later), at the demand the lease has now
        # (the tail's): the workers it gave back are not started again for a gate
        mine = (seen.leases or {}).get(lease) or {}
        held = int(mine.get("replicas", replicas))
        pool.acquire(lease, held, ttl_s=idle.lease_ttl_s)
    else:  # a tail may have given replicas back: the answer finds the run's workers warm (or asleep)
        pool.want(lease, None)
        event = UsageEvent(kind="lease", at=time.time(), pool=str(pool), replicas=replicas, slot=slot)
        record_event(layout.root, event, so)
    if idle.action == "sleep" and idle.sleep_after_s is not None:
        after = idle.sleep_after_s
        _each_worker(pool, lease, "sleep", lambda c: c.sleep(level=SLEEP_LEVEL, after_s=after), log)
    event = UsageEvent(
        kind="gate_open",
        at=time.time(),
        pool=str(pool),
        replicas=held,
        slot=slot,
        policy=idle.action,
        lease_ttl_s=idle.lease_ttl_s if idle.action == "release" else None,
    )
    record_event(layout.root, event, so)
    log.info("%s: worker pool %s while the gate waits (gate_idle %s): %s", slot, pool, idle.action, idle.text)
    return idle


def answer_gate(
    worker_pool: str,
    cfg: RunConfig,
    context: Context,
    log: Any,
    *,
    replicas: int,
    slot: str,
    so: StorageOptions | None,
    answered: bool = True,
) -> bool:
    """Take the run's pool back for the round its gate's answer runs (``answered`` false: a round
    without a gate, after an earlier gate's): the lease taken again with the run's ``replicas``,
    sleeping workers woken; returns whether the pool is ready now (else the caller waits for it,
    deferred). Records ``gate_answered`` (answered) and ``lease`` when it had lapsed."""
    pool, lease, layout = open_pool(worker_pool), lease_id(context), RunLayout(cfg.run_root)
    seen = view(pool, log)
    lease_live = seen.leases is None or lease in seen.leases
    if not answered and lease_live:
        return True  # no gate of this slot, and no earlier one gave the lease back: _start takes it back
    token = pool.token()
    obs = asyncio.run(observe_pool(pool, token, lease))
    asleep = cfg.reviews.gate_idle == "sleep" and _asleep(pool, lease)
    action = answer_action(lease_live=lease_live, ready=len(obs.ready), wanted=replicas, asleep=asleep)
    now = time.time()
    held = replicas if lease_live else 0
    if answered:
        answer = UsageEvent(kind="gate_answered", at=now, pool=str(pool), replicas=held, slot=slot)
        record_event(layout.root, answer, so)
    pool.acquire(lease, replicas, ttl_s=DEFAULT_LEASE_TTL_S)  # the run's replicas again (a lane renews it)
    if not lease_live:
        record_event(
            layout.root, UsageEvent(kind="lease", at=now, pool=str(pool), replicas=replicas, slot=slot), so
        )
    if action == "wake":
        woke = _each_worker(pool, lease, "wake", lambda c: c.wake(), log)
        log.info("%s: %d sleeping workers of %s woken", slot, woke, pool)
    log.info(
        "%s: worker pool %s after the answer: %s (lease %s, %d of %d workers ready)",
        slot,
        pool,
        action,
        "live" if lease_live else "lapsed: taken again",
        len(obs.ready),
        replicas,
    )
    if action != "rewarm":
        return True
    obs = asyncio.run(observe_pool(pool, token, lease))
    decision = pool_readiness(obs, replicas)
    if decision == "refused":
        raise AirflowFailException(why_refused(obs, pool))
    return decision == "ready"


def record_answer(worker_pool: str, cfg: RunConfig, *, slot: str, so: StorageOptions | None) -> None:
    """Record ``gate_answered`` for an answer that runs no round (Accept, Stop): the pool is not
    taken back, but the gate's wait ends here."""
    event = UsageEvent(kind="gate_answered", at=time.time(), pool=str(open_pool(worker_pool)), slot=slot)
    record_event(cfg.run_root, event, so)


def record_warm(
    worker_pool: str,
    cfg: RunConfig,
    *,
    replicas: int,
    requested_at: float,
    slot: str,
    so: StorageOptions | None,
    log: Any,
) -> float:
    """Record the ``warm`` event of a pool the answer waited for (its workers' starts where the
    pool tells them); returns the seconds it took."""
    pool, now = open_pool(worker_pool), time.time()
    workers: list[WorkerStart] = []
    try:
        workers = pool.starts(requested_at)
    except Exception as exc:  # the event then lacks the workers' marks; the round goes on
        log.warning("worker pool %s: its starts not read (%s)", pool, exc)
    event = UsageEvent(
        kind="warm",
        at=now,
        pool=str(pool),
        replicas=replicas,
        slot=slot,
        requested_at=requested_at,
        workers=tuple(workers),
    )
    record_event(cfg.run_root, event, so)
    return now - requested_at


def engine_swapped(cfg: RunConfig, plan: Plan, so: StorageOptions | None) -> str | None:
    """Why the pool an answer got back runs another engine (model, engine options) than the run's
    earlier rounds, or ``None``: while a released gate waited, another run may have started the
    pool with its own settings (a local pool replaces a generation nobody leases; a Kubernetes
    pool's template is replaced once no lease holds it). The round must not run on it."""
    if plan.engine is None:
        return None
    layout = RunLayout(cfg.run_root)
    for slot in reversed(slots(cfg.retries.max_rounds)[: slots(cfg.retries.max_rounds).index(plan.slot)]):
        earlier = read_plan(layout, slot, so)
        if earlier is not None and earlier.engine is not None:
            if earlier.engine == plan.engine:
                return None
            return (
                f"the pool now runs {plan.engine.get('engine')} {plan.engine.get('model')!r}, not what "
                f"{slot} ran ({earlier.engine.get('engine')} {earlier.engine.get('model')!r}): another "
                "run started it with its own settings while this run's gate had given it back. Remedy: "
                "clear this run's pool_setup task (it starts the pool with this run's settings, beside "
                "the other run's), then this plan task"
            )
    return None


# What to do when the answer's round cannot start: the gate asks again (a cleared task re-opens it).
REOPEN = "Remedy: fix the pool (its workers' logs), then clear this plan task: its review gate opens again"


def warm_failure(worker_pool: str, event: dict[str, Any], replicas: int, timeout_s: float) -> str:
    """Why the pool the answer re-warmed is not ready (the trigger's ``timeout`` or ``refused``
    event), with what its backend says and the remedy."""
    why = (
        event.get("reason") or f"{event.get('ready', 0)} of {replicas} workers ready after {timeout_s:.0f} s"
    )
    problems = "".join(f"; {p}" for p in open_pool(worker_pool).problems())
    return f"worker pool {worker_pool!r} not re-warmed after the review ({why}){problems}. {REOPEN}"
