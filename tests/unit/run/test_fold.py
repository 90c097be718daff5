"""Folding a run's tail (:mod:`airflow_batchinfer.run.fold`): after a close, the later slots' plans
are decided as their plan tasks would decide them, and the fold happens only when every one of them
skips without a review gate. Over real files on local disk; no Airflow."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_batchinfer.run.fold import fold_tail, next_slot
from airflow_batchinfer.run.plan import MAX_ROUNDS, NOTHING_PENDING, load_snapshot, propose_slot
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import Plan, slots, write_plan
from airflow_batchinfer.state.layout import RunLayout
from tests.support.rounds import fake_round, make_run

ALL = {f"r{i:02d}" for i in range(30)}
SOME = {f"r{i:02d}" for i in range(20)}  # a third left pending


def folded(cfg: RunConfig, closed: str, dag_slots: list[str]) -> list[Plan] | None:
    """What fold_tail decides after ``closed`` closed, in a DAG of ``dag_slots``."""
    later = dag_slots[dag_slots.index(closed) + 1 :]
    upcoming = next_slot(cfg, later)
    fold = fold_tail(cfg, later, None if upcoming is None else load_snapshot(cfg, upcoming))
    return None if fold is None else list(fold.plans)


def planned_by_tasks(cfg: RunConfig, later: list[str]) -> list[Plan]:
    """What the later plan tasks would write, each after the one before wrote its plan."""
    plans = []
    for slot in later:
        proposal = propose_slot(cfg, slot)
        assert proposal.options == [] and proposal.plan.mode == "skip"
        write_plan(RunLayout(cfg.run_root), proposal.plan)
        plans.append(proposal.plan)
    return plans


@pytest.mark.parametrize(
    ("max_rounds", "dag_rounds", "approve", "stop"),
    [
        (1, 1, SOME, MAX_ROUNDS),  # the last round left rows pending: the tail stops at max_rounds
        (3, 3, ALL, NOTHING_PENDING),  # nothing pending: round-01 stops, round-02 and the tail skip
        (1, 3, SOME, MAX_ROUNDS),  # a DAG with more slots than the run uses: those skip as unused
    ],
)
def test_a_finished_run_folds_into_the_plans_its_later_plan_tasks_would_write(
    tmp_path: Path, max_rounds: int, dag_rounds: int, approve: set[str], stop: str
) -> None:
    cfg = make_run(tmp_path, max_rounds=max_rounds)
    fake_round(cfg, "round-00", approve)
    dag_slots = slots(dag_rounds)
    plans = folded(cfg, "round-00", dag_slots)
    assert plans is not None and [p.slot for p in plans] == dag_slots[1:]
    assert all(p.mode == "skip" for p in plans) and [p.stop for p in plans if p.stop] == [stop]
    assert [p.to_json() for p in plans] == [p.to_json() for p in planned_by_tasks(cfg, dag_slots[1:])]


def test_a_later_round_to_run_a_review_gate_or_an_in_place_tail_keeps_the_dag_as_it_is(
    tmp_path: Path,
) -> None:
    cfg = make_run(tmp_path, max_rounds=2)
    fake_round(cfg, "round-00", SOME)
    assert folded(cfg, "round-00", slots(2)) is None  # round-01 runs the pending third
    for settings in ({"review": "every_round"}, {"strategy": "hybrid"}):  # a gate, then in place
        (home := tmp_path / next(iter(settings.values()))).mkdir()
        cfg = make_run(home, max_rounds=1, **settings)
        fake_round(cfg, "round-00", SOME)
        assert folded(cfg, "round-00", slots(1)) is None, settings


def test_the_tails_close_folds_only_the_report_and_a_missing_snapshot_is_refused(tmp_path: Path) -> None:
    cfg = make_run(tmp_path, max_rounds=1)
    fake_round(cfg, "round-00", SOME)
    assert folded(cfg, "tail", slots(1)) == []
    assert next_slot(cfg, ["round-01", "round-02"]) is None  # unused by a run of max_rounds 1
    assert next_slot(cfg, ["round-01", "tail"]) == "tail"
    with pytest.raises(ValueError, match="needs the snapshot of tail"):
        fold_tail(cfg, ["tail"], None)
