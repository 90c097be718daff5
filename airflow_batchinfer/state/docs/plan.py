"""Each round slot's ``plan.json`` (:class:`Plan`): what the slot does and why, and the settings its
round runs. Slots are ``round-00`` … ``round-{max_rounds-1}`` (infer + judge) and ``tail`` (in-place
retry of whatever rounds left, under the next free round number).

A plan's ``settings`` are what a review changed (:data:`~airflow_batchinfer.state.config.ROUND_SETTINGS`),
its ``config`` the settings its round runs: ``run.json``'s with those changes
(:func:`~airflow_batchinfer.state.config.round_config`), computed once by the plan step and read by
every task of the round. A plan written before plans carried their config reads with it computed as
its round's tasks did then."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

from airflow_batchinfer.exceptions import StorageError
from airflow_batchinfer.state.config import RunConfig, round_config
from airflow_batchinfer.state.docs.io import read_doc, read_run_config, write_doc
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import ShardDescriptor
from airflow_batchinfer.storage.location import StorageOptions, join

TAIL = "tail"
Mode = Literal["rounds", "in_place", "skip"]


def slots(max_rounds: int) -> list[str]:
    return [f"round-{r:02d}" for r in range(max_rounds)] + [TAIL]


@dataclass
class Plan:
    """What one round slot does. ``stop`` is set on the plan that ends the run."""

    slot: str
    round: int
    mode: Mode
    shards: list[ShardDescriptor] = field(default_factory=list)
    reason: str = ""
    stop: str | None = None
    switch_in_place: bool = False
    review: dict[str, Any] | None = None
    # What the round's pool runs (engine, model, engine args), recorded when the round starts: close
    # counts only jobs run by it, so a resume on another model never keeps the old model's rows.
    engine: dict[str, Any] | None = None
    # The same for the judge's own pool (``judge_pool``), when it has one.
    judge_engine: dict[str, Any] | None = None
    # Rows a review accepted as they are: the count and digest of their ids (the report counts them).
    accepted: dict[str, Any] | None = None
    # Settings a review changed for this round and the ones after it (see run.config.ROUND_SETTINGS),
    # over run.json's: inherited from the plan before, so a change holds until changed again.
    settings: dict[str, Any] | None = None
    # What the reviewers' decisions on the previous round's rejected rows did when the gate was
    # answered (:func:`airflow_batchinfer.review.apply.apply_decisions`): counts and id digests.
    reviewed: dict[str, Any] | None = None
    # The settings this round runs (run.json's with ``settings`` over them), computed and validated
    # once by the plan step (run.config.round_config): its jobs, its close and the review desk read
    # them here. None: run.json's (a slot skipped before settings mattered, a plan built by hand).
    config: RunConfig | None = None

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "config": None if self.config is None else self.config.to_dict()}

    def effective_config(self, run: RunConfig) -> RunConfig:
        """The settings this round runs: :attr:`config`, or ``run`` (run.json's) when it has none."""
        return run if self.config is None else self.config

    @property
    def records(self) -> int:
        return sum(s["records"] for s in self.shards)


_PLAN_FIELDS = frozenset(f.name for f in fields(Plan))


def _plan_uri(layout: RunLayout, slot: str) -> str:
    return join(layout.root, TAIL if slot == TAIL else slot, "plan.json")


def read_plan(layout: RunLayout, slot: str, so: StorageOptions | None = None) -> Plan | None:
    uri = _plan_uri(layout, slot)
    data = read_doc(uri, "round plan", so)
    if data is None:
        return None
    data.pop("schema_version", None)
    unknown = sorted(set(data) - _PLAN_FIELDS)
    if unknown:  # a newer release's plan: refused by name, not as a TypeError deep in a task
        raise StorageError(
            f"round plan {uri}: unknown fields {unknown} (written by another release?). Remedy: run every "
            "component on one release, or delete the plan to plan the round again"
        )
    config = data.pop("config", None)
    if config is not None:
        return Plan(**data, config=RunConfig.from_dict(config))
    if data.get("settings"):
        # A plan written before plans carried their settings: computed as its round's tasks did then.
        return Plan(**data, config=round_config(read_run_config(layout.root, so), data["settings"]))
    return Plan(**data)


def write_plan(layout: RunLayout, plan: Plan, so: StorageOptions | None = None) -> None:
    write_doc(_plan_uri(layout, plan.slot), plan.as_dict(), so)


def rounds_ran(layout: RunLayout, max_rounds: int, so: StorageOptions | None = None) -> int:
    """How many of the round slots before the tail ran a round (their plans in storage)."""
    return sum(1 for s in slots(max_rounds)[:-1] if (p := read_plan(layout, s, so)) and p.mode == "rounds")
