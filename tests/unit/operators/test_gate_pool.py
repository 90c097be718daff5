"""The round controller around its review gate (``gate_idle``): an answer whose pool must re-warm
defers on the pool's readiness with the answer's plan stored, and the round runs from that plan once
the pool is ready; a pool already ready runs at once. The pool itself is faked (no workers)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("airflow", reason="needs the airflow extra")

from airflow.providers.standard.operators.hitl import HITLOperator
from airflow.sdk.exceptions import AirflowFailException, TaskDeferred

from airflow_batchinfer.operators import gate_pool, rounds
from airflow_batchinfer.run.close import close_round
from airflow_batchinfer.run.plan import CONTINUE
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import read_plan
from airflow_batchinfer.state.docs.usage import read_usage
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.triggers.pool_ready import PoolReadyTrigger
from tests.support.fake_jobs import IDS, finish_shard, make_run, plan_round

ANSWER = {"chosen_options": [CONTINUE], "responded_by_user": {"name": "alice"}, "params_input": {}}


def gated(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, **settings: Any) -> RunConfig:
    """A run whose round 0 left rows pending for round-01's gate; the controller's pool work faked."""
    cfg = make_run(tmp_path, review="every_round", max_rounds=3, judge={"type": "length", "min_chars": 1},
                   **settings)  # fmt: skip
    plan = plan_round(cfg)
    for shard in plan.shards:
        finish_shard(cfg, 0, shard, set(IDS[:25]))
    assert close_round(cfg, plan) is not None
    monkeypatch.setattr(rounds, "owned_run_config", lambda run_root, context, so=None: cfg)
    monkeypatch.setattr(HITLOperator, "execute_complete", lambda self, context, event: event)
    monkeypatch.setattr(rounds.RoundControllerOperator, "_start", lambda self, cfg, plan, context: None)
    return cfg


def controller(cfg: RunConfig) -> rounds.RoundControllerOperator:
    return rounds.RoundControllerOperator(
        task_id="plan", slot="round-01", run_root=cfg.run_root, worker_pool="local://p", replicas="2", slots=2
    )


def test_an_answer_whose_pool_must_rewarm_defers_with_its_plan_stored_then_runs_it(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = gated(tmp_path, monkeypatch)
    asked: list[int] = []
    monkeypatch.setattr(rounds, "answer_gate", lambda *a, replicas, **k: asked.append(replicas) or False)
    op = controller(cfg)
    context: dict[str, Any] = {"params": {}, "dag": type("D", (), {"dag_id": "d"}), "run_id": "r"}
    with pytest.raises(TaskDeferred) as deferred:
        op.execute_complete(context, ANSWER)  # type: ignore[arg-type]
    assert asked == [2]  # the run's replicas, as the factory passes them
    trigger = deferred.value.trigger
    assert isinstance(trigger, PoolReadyTrigger) and (trigger.replicas, trigger.lease_id) == (2, "d/r")
    assert deferred.value.method_name == "execute_warm"
    stored = read_plan(RunLayout(cfg.run_root), "round-01")
    assert stored is not None and stored.mode == "rounds" and stored.review["choice"] == CONTINUE  # type: ignore[index]
    # a triggerer restarted mid-wait re-creates the trigger from what it serialized
    cls, kwargs = trigger.serialize()
    assert cls.endswith("PoolReadyTrigger") and PoolReadyTrigger(**kwargs).serialize() == (cls, kwargs)

    kwargs = deferred.value.kwargs or {}
    monkeypatch.setattr(gate_pool, "open_pool", lambda ref: type("P", (), {"problems": lambda s: []})())
    with pytest.raises(AirflowFailException, match=r"not re-warmed after the review.*clear this plan task"):
        op.execute_warm(context, {"state": "timeout", "ready": 1}, **kwargs)  # type: ignore[arg-type]
    lanes = op.execute_warm(context, {"state": "ready", "urls": ["u1", "u2"]}, **kwargs)  # type: ignore[arg-type]
    assert lanes and {lane["slot"] for lane in lanes} == {"round-01"}
    warm = [e for e in read_usage(RunLayout(cfg.run_root)) if e.kind == "warm"]
    assert len(warm) == 1 and warm[0].requested_at == kwargs["answered_at"] and warm[0].replicas == 2


def test_an_answer_whose_pool_is_ready_runs_its_round_at_once(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = gated(tmp_path, monkeypatch)
    monkeypatch.setattr(rounds, "answer_gate", lambda *a, **k: True)
    context: dict[str, Any] = {"params": {}, "dag": type("D", (), {"dag_id": "d"}), "run_id": "r"}
    lanes = controller(cfg).execute_complete(context, ANSWER)  # type: ignore[arg-type]
    assert lanes and read_plan(RunLayout(cfg.run_root), "round-01") is not None


class FakePool:
    """A pool's lease book without workers: what the gate asks of it, recorded."""

    backend = "local"

    def __init__(self, leases: dict[str, Any], ready: int = 2) -> None:
        self.leases, self.ready, self.acquired = leases, ready, []  # type: ignore[var-annotated]
        self.wanted: list[tuple[str, int | None]] = []

    def status(self) -> dict[str, Any]:
        return {"leases": self.leases, "idle_ttl_s": 1.0}

    def acquire(self, lease_id: str, replicas: int, *, ttl_s: float) -> int:
        self.acquired.append((lease_id, replicas, ttl_s))
        return replicas

    def want(self, lease_id: str, replicas: int | None = None) -> int:
        self.wanted.append((lease_id, replicas))
        return 2

    def token(self) -> str:
        return "t"

    def endpoints(self, lease_id: str | None = None) -> list[str]:
        return ["http://w1", "http://w2"]

    def __str__(self) -> str:
        return "local://fake"


CONTEXT: dict[str, Any] = {"dag": type("D", (), {"dag_id": "d"}), "run_id": "r"}


def fake_pool(monkeypatch: pytest.MonkeyPatch, pool: FakePool) -> None:
    from airflow_batchinfer.triggers.pool_ready import PoolObservation

    async def observe(p: Any, token: Any, lease: Any = None) -> PoolObservation:
        return PoolObservation(ready=tuple(f"http://w{i}" for i in range(pool.ready)))

    monkeypatch.setattr(gate_pool, "open_pool", lambda ref: pool)
    monkeypatch.setattr(gate_pool, "observe_pool", observe)


def test_a_released_gate_sets_the_leases_expiry_to_the_keep_warm_and_says_so(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import logging

    cfg = make_run(tmp_path, review="every_round", gate_keep_warm_s=2)
    pool = FakePool({"d/r": {"replicas": 1, "ceiling": 2}, "other/run": {}})  # the tail left 1
    fake_pool(monkeypatch, pool)
    idle = gate_pool.open_gate("local://fake", cfg, CONTEXT, logging.getLogger("t"), replicas=2,  # type: ignore[arg-type]
                               response_timeout_s=3600, slot="round-01", so=None)  # fmt: skip
    # lapses 2 s from now, at the tail's demand: no worker is started again for the gate
    assert idle.action == "release" and pool.acquired == [("d/r", 1, 2)] and not pool.wanted
    assert "kept warm 2 s" in idle.text and "(1 does now)" in idle.text and "idle_ttl (1 s)" in idle.text
    (opened,) = read_usage(RunLayout(cfg.run_root))
    assert (opened.kind, opened.policy, opened.replicas, opened.slot, opened.lease_ttl_s) == (
        "gate_open",
        "release",
        1,
        "round-01",
        2,
    )


def test_a_sleeping_gate_asks_each_worker_to_sleep_once_idle_and_the_answer_wakes_them(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import logging

    calls: list[tuple[str, Any]] = []

    class Client:
        def __init__(self, url: str, token: Any = None, timeout: float = 0) -> None:
            self.url = url

        def __enter__(self) -> Client:
            return self

        def __exit__(self, *exc: Any) -> None:
            return None

        def sleep(self, level: int, after_s: float) -> None:
            calls.append((self.url, ("sleep", level, after_s)))

        def wake(self) -> None:
            calls.append((self.url, "wake"))

        def stats(self) -> Any:
            return type("S", (), {"sleeping": True})()

    cfg = make_run(tmp_path, review="every_round", gate_idle="sleep", gate_keep_warm_s=60)
    pool = FakePool({"d/r": {}})
    fake_pool(monkeypatch, pool)
    monkeypatch.setattr(gate_pool, "SyncWorkerClient", Client)
    log = logging.getLogger("t")
    idle = gate_pool.open_gate("local://fake", cfg, CONTEXT, log, replicas=2, response_timeout_s=None,  # type: ignore[arg-type]
                               slot="round-01", so=None)  # fmt: skip
    assert idle.action == "sleep" and not pool.acquired  # the lease is kept (renewed before)
    assert pool.wanted == [("d/r", None)]  # what a tail gave back is taken again before the gate
    assert calls == [("http://w1", ("sleep", 1, 60)), ("http://w2", ("sleep", 1, 60))]
    calls.clear()
    ready = gate_pool.answer_gate("local://fake", cfg, CONTEXT, log, replicas=2, slot="round-01", so=None)  # type: ignore[arg-type]
    assert ready and calls == [("http://w1", "wake"), ("http://w2", "wake")]
    assert pool.acquired and pool.acquired[-1][:2] == ("d/r", 2)


def test_an_answer_after_the_lease_lapsed_takes_it_again_and_waits_for_the_workers(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import logging

    cfg = make_run(tmp_path, review="every_round")
    pool = FakePool({}, ready=0)  # the lease lapsed, the workers exited
    fake_pool(monkeypatch, pool)
    ready = gate_pool.answer_gate("local://fake", cfg, CONTEXT, logging.getLogger("t"), replicas=2,  # type: ignore[arg-type]
                                  slot="round-01", so=None)  # fmt: skip
    assert not ready and pool.acquired[0][:2] == ("d/r", 2)
    kinds = [(e.kind, e.replicas) for e in read_usage(RunLayout(cfg.run_root))]
    assert sorted(kinds) == [("gate_answered", 0), ("lease", 2)]


def test_a_pool_that_came_back_running_another_model_is_refused_naming_both(tmp_path: Any) -> None:
    """While a released gate waits, another run may start the pool with its own settings: the
    answer's round must not run its jobs there (their rows would be another model's)."""
    from airflow_batchinfer.state.docs import Plan, write_plan

    cfg = make_run(tmp_path, review="every_round", max_rounds=3)
    layout = RunLayout(cfg.run_root)
    ours = {"engine": "simulated", "model": "ours"}
    write_plan(layout, Plan(slot="round-00", round=0, mode="rounds", engine=ours))
    write_plan(layout, Plan(slot="round-01", round=1, mode="skip"))  # no engine: looked past
    back = Plan(slot="round-02", round=2, mode="rounds", engine=ours)
    assert gate_pool.engine_swapped(cfg, back, None) is None
    back.engine = {"engine": "simulated", "model": "theirs"}
    why = gate_pool.engine_swapped(cfg, back, None)
    assert why is not None and "'theirs'" in why and "round-00 ran" in why and "'ours'" in why
    assert "clear this run's pool_setup" in why
    first = Plan(slot="round-00", round=0, mode="rounds", engine=back.engine)
    assert gate_pool.engine_swapped(cfg, first, None) is None  # nothing earlier to differ from
