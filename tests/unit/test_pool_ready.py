"""Pool readiness (issue 12 item 3, warm fast paths): one pure decision, :func:`pool_readiness`, that
the pool setup task asks inline and :class:`PoolReadyTrigger` asks at each poll. No sockets: the
workers' ``/v1/ready`` answers are injected at ``ready_workers``."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("airflow", reason="needs the airflow extra")

from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.operators import pool as pool_ops
from airflow_batchinfer.operators.pool import PoolSetupOperator
from airflow_batchinfer.pools.static import StaticPool
from airflow_batchinfer.triggers import pool_ready
from airflow_batchinfer.triggers.pool_ready import (
    PoolObservation,
    PoolReadyTrigger,
    observe_pool,
    pool_readiness,
    why_refused,
)

URLS = ["http://w1:8000", "http://w2:8000"]


# ------------------------------------------------------------------------------- the decision
def test_ready_when_enough_workers_answer_ready() -> None:
    assert pool_readiness(PoolObservation(ready=tuple(URLS)), 2) == "ready"
    assert pool_readiness(PoolObservation(ready=tuple(URLS)), 1) == "ready"
    assert pool_readiness(PoolObservation(ready=(URLS[0],)), 2) == "wait"
    assert pool_readiness(PoolObservation(), 1) == "wait"


def test_a_pool_running_other_settings_is_not_ready() -> None:
    obs = PoolObservation(ready=tuple(URLS), spec_key="old", current_ready=2)
    assert pool_readiness(obs, 2, spec_key="new") == "wait"
    assert pool_readiness(obs, 2, spec_key="old") == "ready"
    # an adopted Deployment carries no spec hash: its template is someone else's, its pods count
    assert pool_readiness(PoolObservation(ready=tuple(URLS), spec_key=None), 2, spec_key="new") == "ready"
    # no spec asked for (a static pool): any ready workers do
    assert pool_readiness(obs, 2) == "ready"


def test_a_rollout_under_way_is_not_ready_even_with_ready_pods() -> None:
    # pods of the old template still answer ready, but only one of the new template is ready
    obs = PoolObservation(ready=tuple(URLS), spec_key="new", current_ready=1)
    assert pool_readiness(obs, 2, spec_key="new") == "wait"
    assert pool_readiness(PoolObservation(ready=tuple(URLS), spec_key="new", current_ready=2), 2,
                          spec_key="new") == "ready"  # fmt: skip


def test_timeout_only_past_the_deadline_and_never_over_ready() -> None:
    slow = PoolObservation(ready=(URLS[0],))
    assert pool_readiness(slow, 2, now=10.0, deadline=20.0) == "wait"
    assert pool_readiness(slow, 2, now=20.5, deadline=20.0) == "timeout"
    assert pool_readiness(PoolObservation(ready=tuple(URLS)), 2, now=99.0, deadline=20.0) == "ready"


def test_a_pool_that_cannot_work_from_here_is_refused_whatever_else() -> None:
    shared = PoolObservation(ready=tuple(URLS), shared=(URLS[0],))
    assert pool_readiness(shared, 2) == "refused"
    assert pool_readiness(shared, 2, now=99.0, deadline=1.0) == "refused"  # not a timeout
    assert pool_readiness(PoolObservation(elsewhere=True), 1) == "refused"
    why = why_refused(shared, StaticPool(urls=URLS, name="conn"))
    assert URLS[0] in why and "several workers" in why and "each worker's own URL" in why
    from airflow_batchinfer.pools import LocalPool

    why = why_refused(PoolObservation(elsewhere=True), LocalPool("gpu", state_dir="/srv/pools"))
    assert "local://gpu has no state on this host (/srv/pools/gpu)" in why
    assert "one host" in why and "kubernetes://" in why


# ---------------------------------------------------------------------------- the observation
class FakePool:
    backend = "fake"

    def __init__(self, urls: list[str], rollout: dict[str, Any] | None = None) -> None:
        self.urls = urls
        self._rollout = rollout
        self.asked: list[str | None] = []

    def endpoints(self, lease_id: str | None = None) -> list[str]:
        self.asked.append(lease_id)
        return list(self.urls)

    def token(self) -> str:
        return "t"

    def __getattr__(self, name: str) -> Any:
        if name == "rollout" and self._rollout is not None:
            return lambda: self._rollout
        raise AttributeError(name)


@pytest.fixture
def answering(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The workers that answer ``/v1/ready`` (instead of HTTP)."""
    up: set[str] = set()

    async def fake_ready_workers(urls: Sequence[str], token: str | None, **_: Any) -> list[str]:
        assert token == "t"
        return [u for u in urls if u in up]

    monkeypatch.setattr(pool_ready, "ready_workers", fake_ready_workers)
    monkeypatch.setattr(pool_ready, "worker_instances", fake_worker_instances)
    return up


SHARED: set[str] = set()  # URLs that several worker processes answer (a balancer in front of them)


async def fake_worker_instances(urls: Sequence[str], **_: Any) -> dict[str, set[str]]:
    return {u: {f"{u}#1", f"{u}#2"} if u in SHARED else {f"{u}#1"} for u in urls}


async def test_observe_asks_the_leases_workers_and_reads_a_rollout(answering: set[str]) -> None:
    answering.update(URLS[:1])
    pool = FakePool(URLS, rollout={"spec_key": "k", "current_ready": 1})
    obs = await observe_pool(pool, "t", "dag/run")  # type: ignore[arg-type]
    assert obs == PoolObservation(ready=(URLS[0],), spec_key="k", current_ready=1)
    assert pool.asked == ["dag/run"]
    assert await observe_pool(FakePool(URLS), "t") == PoolObservation(ready=(URLS[0],))  # type: ignore[arg-type]


async def test_observe_finds_a_static_url_shared_by_several_workers(
    answering: set[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    answering.update(URLS)
    monkeypatch.setattr(f"{__name__}.SHARED", {URLS[1]})
    obs = await observe_pool(StaticPool(urls=URLS, rpc_token="t"), "t")
    assert obs.shared == (URLS[1],) and pool_readiness(obs, 2) == "refused"
    # only a static pool is probed: a backend that finds its workers itself lists each one
    assert (await observe_pool(FakePool(URLS), "t")).shared == ()  # type: ignore[arg-type]


async def test_observe_a_local_pool_started_on_another_host(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_batchinfer.pools import LocalPool

    pool = LocalPool("elsewhere", state_dir=tmp_path)
    assert await observe_pool(pool, None) == PoolObservation(elsewhere=True)
    with pytest.raises(ConfigError, match="no state on this host"):
        pool.token()  # reading the token never writes one
    assert not (tmp_path / "elsewhere" / "token").exists()


def test_a_kubernetes_rollout_counts_only_pods_of_the_current_template() -> None:
    pytest.importorskip("kubernetes", reason="needs the kubernetes extra")
    from kubernetes import client

    from airflow_batchinfer.pools.kubernetes import KubernetesPool
    from airflow_batchinfer.pools.kubernetes.objects import SPEC_HASH

    pool = KubernetesPool(client.ApiClient(), "p", "ns")

    def dep(generation: int, observed: int, replicas: int, updated: int, ready: int) -> Any:
        return SimpleNamespace(
            metadata=SimpleNamespace(generation=generation, annotations={SPEC_HASH: "abc"}),
            status=SimpleNamespace(
                observed_generation=observed,
                replicas=replicas,
                updated_replicas=updated,
                ready_replicas=ready,
            ),
        )

    cases = [
        (dep(3, 3, 2, 2, 2), 2),  # rolled out
        (dep(3, 3, 2, 2, 1), 1),  # one still loading its model
        (dep(4, 3, 2, 2, 2), 0),  # the controller has not seen the latest change yet
        (dep(3, 3, 3, 2, 3), 0),  # an old-template pod is still there (and ready)
    ]
    for found, current in cases:
        pool._deployment = lambda found=found: found  # type: ignore[method-assign]
        assert pool.rollout() == {"spec_key": "abc", "current_ready": current}


# ------------------------------------------------------------------ the setup task and the trigger
def _context() -> Any:
    return {"dag": SimpleNamespace(dag_id="d"), "run_id": "r1"}


def _setup(
    monkeypatch: pytest.MonkeyPatch, replicas: int = 2, inline_wait_s: float = 0.0
) -> PoolSetupOperator:
    monkeypatch.setattr(pool_ops, "open_pool", lambda ref: StaticPool(urls=URLS, rpc_token="t"))
    return PoolSetupOperator(
        task_id="pool_setup", worker_pool="conn", replicas=replicas, inline_wait_s=inline_wait_s
    )


def test_setup_on_a_ready_pool_returns_at_once_without_deferring(
    monkeypatch: pytest.MonkeyPatch, answering: set[str]
) -> None:
    answering.update(URLS)
    op = _setup(monkeypatch)
    op.defer = lambda **kw: pytest.fail("a warm pool must not defer")  # type: ignore[method-assign]
    t0 = time.monotonic()
    assert op.execute(_context()) == URLS
    assert time.monotonic() - t0 < 1.0


def test_setup_defers_while_the_pool_is_not_ready(
    monkeypatch: pytest.MonkeyPatch, answering: set[str]
) -> None:
    answering.update(URLS[:1])
    op = _setup(monkeypatch)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute(_context())
    trigger = deferred.value.trigger
    assert isinstance(trigger, PoolReadyTrigger)
    assert (trigger.replicas, trigger.lease_id, trigger.spec_key) == (2, "d/r1", None)
    assert deferred.value.method_name == "execute_complete"


def test_setup_waits_inline_for_a_pool_that_gets_ready_soon(
    monkeypatch: pytest.MonkeyPatch, answering: set[str]
) -> None:
    """Workers ready within inline_wait_s cost no deferral: the setup asks again while they start."""
    answering.update(URLS[:1])
    op = _setup(monkeypatch, inline_wait_s=30.0)
    real, asked = pool_ops.observe_pool, []

    async def observe(*args: Any) -> Any:
        asked.append(1)
        if len(asked) == 3:  # the second worker answers ready on the third look
            answering.update(URLS)
        return await real(*args)

    monkeypatch.setattr(pool_ops, "observe_pool", observe)
    op.defer = lambda **kw: pytest.fail("a pool ready within inline_wait_s must not defer")  # type: ignore[method-assign]
    assert op.execute(_context()) == URLS
    assert len(asked) == 3


def test_setup_defers_once_inline_wait_s_has_passed(
    monkeypatch: pytest.MonkeyPatch, answering: set[str]
) -> None:
    answering.update(URLS[:1])
    op = _setup(monkeypatch, inline_wait_s=0.3)
    real, asked = pool_ops.observe_pool, []

    async def observe(*args: Any) -> Any:
        asked.append(1)
        return await real(*args)

    monkeypatch.setattr(pool_ops, "observe_pool", observe)
    with pytest.raises(TaskDeferred):
        op.execute(_context())
    assert len(asked) >= 2  # asked again while waiting, then deferred


async def test_the_trigger_decides_as_the_setup_does(
    monkeypatch: pytest.MonkeyPatch, answering: set[str]
) -> None:
    pool = FakePool(URLS, rollout={"spec_key": "new", "current_ready": 2})

    async def fake_open(ref: str) -> FakePool:
        return pool

    monkeypatch.setattr(pool_ready, "aopen_pool", fake_open)
    answering.update(URLS)
    # ready pods, but of another spec: the trigger keeps waiting, to its deadline
    trigger = PoolReadyTrigger(worker_pool="x", replicas=2, deadline=time.time() + 0.3, poll_interval_s=0.05,
                               spec_key="newer")  # fmt: skip
    events = [e async for e in trigger.run()]
    assert [e.payload["state"] for e in events] == ["timeout"]
    trigger = PoolReadyTrigger(worker_pool="x", replicas=2, deadline=time.time() + 5, poll_interval_s=0.05,
                               spec_key="new")  # fmt: skip
    events = [e async for e in trigger.run()]
    assert events[0].payload == {"state": "ready", "urls": URLS}
    # the spec key travels with the trigger to the triggerer
    assert trigger.serialize()[1]["spec_key"] == "new"


def test_setup_is_retried_once_unless_the_dag_says_otherwise() -> None:
    # the retry heals Airflow 3.3.2's resume-after-defer race: it finds the pool warm, no deferral
    from airflow_batchinfer.dag_factory import build_batch_inference_dag

    setup = PoolSetupOperator(task_id="s", worker_pool="conn")
    assert (setup.retries, setup.retry_delay) == (1, timedelta(seconds=5))
    assert PoolSetupOperator(task_id="s", worker_pool="conn", retries=3).retries == 3
    built = build_batch_inference_dag("d").get_task("pool_setup")
    assert (built.retries, built.retry_delay) == (1, timedelta(seconds=5))
    quiet = build_batch_inference_dag("q", default_args={"retries": 0, "retry_delay": timedelta(seconds=1)})
    setup = quiet.get_task("pool_setup")
    assert (setup.retries, setup.retry_delay) == (0, timedelta(seconds=1))


def test_a_bad_setting_fails_the_setup_without_a_retry() -> None:
    op = PoolSetupOperator(task_id="pool_setup", worker_pool="local://p")  # no allowed_prefixes
    with pytest.raises(
        AirflowFailException, match=r"worker pool 'local://p': a local pool needs allowed_prefixes"
    ):
        op.execute(_context())


def test_a_pool_not_ready_by_its_deadline_fails_the_setup_without_a_retry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    op = _setup(monkeypatch)
    with pytest.raises(AirflowFailException, match=r"1 of 2 workers ready after 900 s.*Remedy"):
        op.execute_complete(_context(), {"state": "timeout", "ready": 1})


# --------------------------------------------------------------- pools that cannot work from here
def test_setup_refuses_a_static_url_shared_by_several_workers_at_once(
    monkeypatch: pytest.MonkeyPatch, answering: set[str]
) -> None:
    answering.update(URLS)
    monkeypatch.setattr(f"{__name__}.SHARED", {URLS[0]})
    op = _setup(monkeypatch)
    with pytest.raises(AirflowFailException, match=r"answered by several workers"):
        op.execute(_context())
    # a trigger that saw it instead (the pool was still starting at setup) fails the task the same way
    with pytest.raises(AirflowFailException, match=r"several workers"):
        op.execute_complete(
            _context(), {"state": "refused", "reason": "conn: x is answered by several workers"}
        )


@pytest.mark.parametrize(
    ("executor", "refused"),
    [
        ("LocalExecutor", False),
        ("airflow.executors.local_executor.LocalExecutor", False),
        ("CeleryExecutor", True),
        ("LocalExecutor,CeleryExecutor", True),  # some tasks may go to Celery workers elsewhere
        ("KubernetesExecutor", True),
        ("my_edge:airflow.providers.edge3.executors.EdgeExecutor", True),
    ],
)
def test_the_one_host_decision(executor: str, refused: bool) -> None:
    from airflow_batchinfer.pools.one_host import one_host_refusal

    why = one_host_refusal("local://gpu", executor)
    assert (why is not None) == refused
    if why:
        assert executor.split(",")[-1].rsplit(".", 1)[-1].rsplit(":", 1)[-1] in why
        assert "one host" in why and "static pool" in why and "kubernetes://" in why and "one_host" in why
    # a deployment that runs every component on one host says so
    assert one_host_refusal("local://gpu", executor, one_host=True) is None


def test_setup_refuses_a_local_pool_under_celery_before_starting_anything(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "CeleryExecutor")
    monkeypatch.setenv("BATCHINFER_CACHE", str(tmp_path))
    op = PoolSetupOperator(task_id="pool_setup", worker_pool="local://gpu", allowed_prefixes=[str(tmp_path)])
    with pytest.raises(AirflowFailException, match=r"CeleryExecutor may run tasks on other hosts"):
        op.execute(_context())
    assert not list(tmp_path.rglob("token")) and not list(tmp_path.rglob("pool.json"))


async def test_the_trigger_refuses_a_local_pool_whose_state_is_on_another_host(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv("BATCHINFER_CACHE", str(tmp_path))
    trigger = PoolReadyTrigger(worker_pool="local://gpu", replicas=1, deadline=time.time() + 900)
    t0 = time.monotonic()
    events = [e async for e in trigger.run()]
    assert time.monotonic() - t0 < 5  # not at the 900 s deadline
    assert [e.payload["state"] for e in events] == ["refused"]
    assert "no state on this host" in events[0].payload["reason"]
    assert not list(tmp_path.rglob("token"))


def test_one_host_in_the_config_lets_a_local_pool_start_under_celery(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "CeleryExecutor")
    monkeypatch.setenv("AIRFLOW__BATCHINFER__ONE_HOST", "True")

    def local_up(self: Any, pool: Any, replicas: int, context: Any) -> None:
        raise ConfigError(f"{pool} started")

    monkeypatch.setattr(PoolSetupOperator, "_local_up", local_up)
    op = PoolSetupOperator(task_id="pool_setup", worker_pool="local://gpu", allowed_prefixes=[str(tmp_path)])
    with pytest.raises(AirflowFailException, match=r"local://gpu started"):  # past the refusal
        op.execute(_context())


async def test_the_trigger_refuses_a_shared_static_url_it_meets(
    monkeypatch: pytest.MonkeyPatch, answering: set[str]
) -> None:
    async def fake_open(ref: str) -> StaticPool:
        return StaticPool(urls=URLS, rpc_token="t", name="conn")

    monkeypatch.setattr(pool_ready, "aopen_pool", fake_open)
    monkeypatch.setattr(f"{__name__}.SHARED", {URLS[0]})
    answering.update(URLS)
    trigger = PoolReadyTrigger(
        worker_pool="conn", replicas=2, deadline=time.time() + 900, poll_interval_s=0.05
    )
    events = [e async for e in trigger.run()]
    assert [e.payload["state"] for e in events] == ["refused"]
    assert "several workers" in events[0].payload["reason"]


def test_a_local_pool_allows_the_adapters_a_run_may_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """The workers load the adapter directories the DAG's defaults and the deployment allow (a
    list of theirs, not each run's adapters: the pool's spec stays the same from run to run)."""
    from airflow_batchinfer.spec.limits import TriggerLimits

    started: list[Any] = []

    def start(self: Any, spec: Any, **kwargs: Any) -> list[str]:
        started.append(spec)
        raise ConfigError("started")

    monkeypatch.setattr(pool_ops.LocalPool, "start", start)
    limits = TriggerLimits(allowed_worker_pools=("local://",), allowed_adapters=("/models/lora/",))
    op = PoolSetupOperator(
        task_id="pool_setup", worker_pool="local://gpu", allowed_prefixes=[str(tmp_path)], limits=limits
    )
    context = {**_context(), "params": {"adapters": {"sql": "/models/lora/sql"}}}
    with pytest.raises(AirflowFailException, match="started"):
        op.execute(context)
    assert started[0].allowed_adapters == ("/models/lora/",)


async def test_the_trigger_keeps_a_local_lease_and_its_workers_while_it_waits(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, answering: set[str]
) -> None:
    """A warm local worker that idles out just as a run takes its lease exits during the wait:
    with ``keep_s`` the trigger keeps the lease at each poll (which starts a dead worker again);
    without it the trigger only observes."""
    from airflow_batchinfer.pools import LocalPool

    kept: list[tuple[str, float]] = []

    class Kept(LocalPool):
        def has_state(self) -> bool:
            return True

        def token(self) -> str:
            return "t"

        def keep(self, lease_id: str, *, ttl_s: float = 0.0) -> str | None:
            kept.append((lease_id, ttl_s))
            return None

        def endpoints(self, lease_id: str | None = None) -> list[str]:
            return URLS

    pool = Kept("p", state_dir=tmp_path)

    async def fake_open(ref: str) -> LocalPool:
        return pool

    monkeypatch.setattr(pool_ready, "aopen_pool", fake_open)
    answering.update(URLS)
    trigger = PoolReadyTrigger(worker_pool="local://p", replicas=2, deadline=time.time() + 5, lease_id="d/r",
                               poll_interval_s=0.05, keep_s=60.0)  # fmt: skip
    events = [e async for e in trigger.run()]
    assert events[0].payload["state"] == "ready" and kept == [("d/r", 60.0)]
    assert PoolReadyTrigger(**trigger.serialize()[1]).keep_s == 60.0  # survives a triggerer restart
    kept.clear()
    plain = PoolReadyTrigger(worker_pool="local://p", replicas=2, deadline=time.time() + 5, lease_id="d/r")
    assert [e.payload["state"] async for e in plain.run()] == ["ready"] and kept == []
