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

from airflow_batchinfer.operators import pool as pool_ops
from airflow_batchinfer.operators.pool import PoolSetupOperator
from airflow_batchinfer.pools.static import StaticPool
from airflow_batchinfer.triggers import pool_ready
from airflow_batchinfer.triggers.pool_ready import (
    PoolObservation,
    PoolReadyTrigger,
    observe_pool,
    pool_readiness,
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
    return up


async def test_observe_asks_the_leases_workers_and_reads_a_rollout(answering: set[str]) -> None:
    answering.update(URLS[:1])
    pool = FakePool(URLS, rollout={"spec_key": "k", "current_ready": 1})
    obs = await observe_pool(pool, "t", "dag/run")  # type: ignore[arg-type]
    assert obs == PoolObservation(ready=(URLS[0],), spec_key="k", current_ready=1)
    assert pool.asked == ["dag/run"]
    assert await observe_pool(FakePool(URLS), "t") == PoolObservation(ready=(URLS[0],))  # type: ignore[arg-type]


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


def _setup(monkeypatch: pytest.MonkeyPatch, replicas: int = 2) -> PoolSetupOperator:
    monkeypatch.setattr(pool_ops, "open_pool", lambda ref: StaticPool(urls=URLS, rpc_token="t"))
    return PoolSetupOperator(task_id="pool_setup", worker_pool="conn", replicas=replicas)


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
