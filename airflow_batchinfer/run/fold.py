"""Folding a run's tail into the close that finishes it.

After the last round that does work, a factory DAG still walks its later round slots and then the
report: each later slot's plan task finds nothing to do (a skip, no review gate), its lanes map
nothing, its close closes nothing, and only then does the report task write the report. Each of
those is an Airflow task start (a scheduler pass, a process, the DAG parsed), seconds after the
last job. When a round's close finds the run finished, it writes the plans those slots would write
and the report instead, and its operator skips their tasks
(:class:`~airflow_batchinfer.operators.rounds.CloseRoundOperator`).

:func:`fold_tail` decides without I/O, from what the later plan tasks would read: the snapshot of
the run's next slot (:func:`~airflow_batchinfer.run.plan.load_snapshot`). It proposes each later
slot in turn as its plan task would (:func:`~airflow_batchinfer.run.plan.propose`), and folds only
when every one of them skips without a review gate; a slot that would run a round, retry in place
or ask a person keeps the DAG as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from airflow_batchinfer.run.plan import RoundSnapshot, propose, slots_before
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import Plan, slots


@dataclass(frozen=True)
class Fold:
    """The plans of the later slots, in slot order: each a skip without a review gate, as its plan
    task would write it."""

    plans: tuple[Plan, ...]


def next_slot(cfg: RunConfig, later: Sequence[str]) -> str | None:
    """The first of ``later`` (the DAG's slots after the closed one) that the run uses: the one whose
    snapshot :func:`fold_tail` needs (``None``: the closed slot was the run's last)."""
    used = slots(cfg.retries.max_rounds)
    return next((s for s in later if s in used), None)


def fold_tail(cfg: RunConfig, later: Sequence[str], upcoming: RoundSnapshot | None) -> Fold | None:
    """Whether the run is finished after a close, and the plans its later slots would write.

    ``later``: the DAG's slots after the closed one, in order; ``upcoming``: the snapshot of the
    run's next slot (:func:`next_slot`; its ``prior`` holds the plans so far), ``None`` after the
    tail (``later`` empty: only the report is left). A later slot skips without changing the round, so every
    one of them decides from the same pending set and summary. ``None``: a later slot does work (a
    round, an in-place retry, a review gate); nothing folds."""
    if upcoming is None:
        if later:  # the tail is every run's last slot: a later slot means a used one
            raise ValueError(f"folding {list(later)} needs the snapshot of {next_slot(cfg, later)}")
        return Fold(())
    known = {p.slot: p for p in upcoming.prior}
    plans: list[Plan] = []
    for slot in later:
        prior = tuple(known[s] for s in slots_before(cfg, slot) if s in known)
        proposal = propose(cfg, RoundSnapshot(slot, prior, upcoming.pending, upcoming.last))
        if proposal.options or proposal.plan.mode != "skip":
            return None
        known[slot] = proposal.plan
        plans.append(proposal.plan)
    return Fold(tuple(plans))
