"""Each round slot's ``plan.json`` (:class:`Plan`): what the slot does and why, and the settings its
round runs. Slots are ``round-00`` … ``round-{max_rounds-1}`` (infer + judge) and ``tail`` (in-place
retry of whatever rounds left, under the next free round number).

A plan's ``settings`` are what a review changed (:data:`~airflow_batchinfer.state.config.ROUND_SETTINGS`),
its ``config`` the settings its round runs: ``run.json``'s with those changes
(:func:`~airflow_batchinfer.state.config.round_config`), computed once by the plan step and read by
every task of the round."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, PlainSerializer, PlainValidator, TypeAdapter

from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs.io import Digest, DocModel, read_model
from airflow_batchinfer.state.docs.reviewed import ReviewApplied
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.state.shards import PlannedShard
from airflow_batchinfer.storage.json_doc import write_bytes
from airflow_batchinfer.storage.location import StorageOptions, join, resolve

TAIL = "tail"
Mode = Literal["rounds", "in_place", "skip"]


def _config(value: Any) -> RunConfig:
    return value if isinstance(value, RunConfig) else RunConfig.from_dict(value)


# run.json's shape, checked by RunConfig itself (its own unknown-field check)
StoredConfig = Annotated[RunConfig, PlainValidator(_config), PlainSerializer(lambda c: c.to_dict())]


def slots(max_rounds: int) -> list[str]:
    return [f"round-{r:02d}" for r in range(max_rounds)] + [TAIL]


class Plan(DocModel):
    """What one round slot does. ``stop`` is set on the plan that ends the run."""

    slot: str
    round: int
    mode: Mode
    shards: list[PlannedShard] = Field(default_factory=list)
    reason: str = ""
    stop: str | None = None
    switch_in_place: bool = False
    review: dict[str, Any] | None = None  # the gate's answer that chose this plan (who, what, when)
    # What the round's pool runs (engine, model, engine args), recorded when the round starts: close
    # counts only jobs run by it, so a resume on another model never keeps the old model's rows.
    engine: dict[str, Any] | None = None
    # The same for the judge's own pool (``judge_pool``), when it has one.
    judge_engine: dict[str, Any] | None = None
    # Rows a review accepted as they are: the count and digest of their ids (the report counts them).
    accepted: Digest | None = None
    # Settings a review changed for this round and the ones after it (see state.config.ROUND_SETTINGS),
    # over run.json's: inherited from the plan before, so a change holds until changed again.
    settings: dict[str, Any] | None = None
    # What the reviewers' decisions on the previous round's rejected rows did when the gate was
    # answered (:func:`airflow_batchinfer.review.apply.apply_decisions`): counts and id digests.
    reviewed: ReviewApplied | None = None
    # The settings this round runs (run.json's with ``settings`` over them), computed and validated
    # once by the plan step (state.config.round_config): its jobs, its close and the review desk read
    # them here. None: run.json's (a skipped slot, a plan built by hand).
    config: StoredConfig | None = None

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset()

    def effective_config(self, run: RunConfig) -> RunConfig:
        """The settings this round runs: :attr:`config`, or ``run`` (run.json's) when it has none."""
        return run if self.config is None else self.config

    @property
    def records(self) -> int:
        return sum(s.records for s in self.shards)


_PLAN = TypeAdapter(Plan)
_REMEDY = "run every component on one release, or delete the plan to plan the round again"


def _plan_uri(layout: RunLayout, slot: str) -> str:
    return join(layout.root, TAIL if slot == TAIL else slot, "plan.json")


def read_plan(layout: RunLayout, slot: str, so: StorageOptions | None = None) -> Plan | None:
    return read_model(_PLAN, _plan_uri(layout, slot), "round plan", so, remedy=_REMEDY)


def write_plan(layout: RunLayout, plan: Plan, so: StorageOptions | None = None) -> None:
    write_bytes(resolve(_plan_uri(layout, plan.slot), so), plan.encode())


def rounds_ran(layout: RunLayout, max_rounds: int, so: StorageOptions | None = None) -> int:
    """How many of the round slots before the tail ran a round (their plans in storage)."""
    return sum(1 for s in slots(max_rounds)[:-1] if (p := read_plan(layout, s, so)) and p.mode == "rounds")
