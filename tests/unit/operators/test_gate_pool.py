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
