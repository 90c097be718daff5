"""What a round's plan holds per shard (:class:`PlannedShard`): the shard's reference (storage's
:class:`~airflow_batchinfer.storage.shard_ref.ShardRef` or
:class:`~airflow_batchinfer.storage.shard_ref.RangeRef`) and what the round asks of it.

Stored flat, as one object: the ref's keys and the plan's (``spot_check_rate``, ``round``, ``slot``)
side by side, in :data:`~airflow_batchinfer.storage.shard_ref.KEY_ORDER`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, model_serializer, model_validator

from airflow_batchinfer.storage.shard_ref import PLAN_KEYS, AnyRef, RangeRef, ShardRef, ordered, parse_ref


class PlannedShard(BaseModel):
    """One shard of a round's plan. ``spot_check_rate``: the share of the shard's judge-approved rows
    its judge job holds back for people (``spot_check_approved``), set by the round's plan from the
    rows it plans. ``round`` and ``slot``: the round, and the slot whose plan holds the settings a
    review changed, where a plan names them (none: the plan's own)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ref: AnyRef
    spot_check_rate: float | None = None
    round: int | None = None
    slot: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: Any) -> Any:
        """The stored (flat) form, or a ref alone: the ref's keys and the plan's apart."""
        if isinstance(data, ShardRef | RangeRef):
            return {"ref": data}
        if isinstance(data, Mapping) and "ref" not in data:
            own = {k: data[k] for k in PLAN_KEYS if k in data}
            return {"ref": parse_ref({k: v for k, v in data.items() if k not in PLAN_KEYS}), **own}
        return data

    @model_serializer(mode="plain")
    def _stored(self) -> dict[str, Any]:
        own = {k: getattr(self, k) for k in PLAN_KEYS if getattr(self, k) is not None}
        return ordered({**self.ref.to_json(), **own})

    @classmethod
    def of(cls, ref: Mapping[str, Any] | ShardRef | RangeRef | PlannedShard) -> PlannedShard:
        """``ref`` as a planned shard (a stored one parsed; a planned one as it is)."""
        return ref if isinstance(ref, PlannedShard) else cls.model_validate(ref)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @property
    def shard_id(self) -> str:
        return self.ref.shard_id

    @property
    def uri(self) -> str:
        return self.ref.uri

    @property
    def records(self) -> int:
        return self.ref.records

    @property
    def range_ref(self) -> RangeRef | None:
        """The shard's range ref when it is a round-0 range shard."""
        return self.ref if isinstance(self.ref, RangeRef) else None

    def with_ref(self, ref: ShardRef | RangeRef) -> PlannedShard:
        return self.model_copy(update={"ref": ref})

    def with_spot_check(self, rate: float) -> PlannedShard:
        return self.model_copy(update={"spot_check_rate": rate})


def planned(shards: Iterable[ShardRef | RangeRef | PlannedShard]) -> list[PlannedShard]:
    """``shards`` as a plan holds them (refs with nothing asked of them yet)."""
    return [PlannedShard.of(s) for s in shards]
