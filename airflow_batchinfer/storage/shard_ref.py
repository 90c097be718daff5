"""References to shards, what travels between tasks (XCom, plans, manifests) for one shard: never
its records, a reference and a count.

* :class:`ShardRef`: a shard that is a file of its own (sharding, recompaction, a review's split).
* :class:`RangeRef`: a round-0 *range shard* (:mod:`airflow_batchinfer.storage.ranges`), bytes of the
  input read in place.

Both are frozen pydantic models parsed once where they are read (:func:`parse_ref`, or a document's
field of type :data:`AnyRef`): unknown keys are refused. Their stored form (:meth:`to_json`) holds
the keys of the fields that are set, in one fixed order (:data:`KEY_ORDER`), as every document that
carries them always has.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    PlainSerializer,
    PlainValidator,
    SerializerFunctionWrapHandler,
    Tag,
    TypeAdapter,
    model_serializer,
)

from airflow_batchinfer.storage.digest import IdDigest
from airflow_batchinfer.storage.fan_out import FanOut


def _digest(value: Any) -> IdDigest:
    return value.copy() if isinstance(value, IdDigest) else IdDigest.from_dict(value)


# ``{"count": n, "sum": "<32 hex digits>"}`` stored; a copy held (an IdDigest adds in place)
StoredDigest = Annotated[IdDigest, PlainValidator(_digest), PlainSerializer(lambda d: d.to_dict())]

# The keys of a shard's stored form, in the order every document writes them: a ref's, and the keys
# a round's plan adds (state.shards.PlannedShard).
KEY_ORDER = (
    "shard_id",
    "uri",
    "records",
    "ids",
    "range",
    "bytes",
    "version",
    "estimated",
    "spot_check_rate",
    "lead_in",
    "pieces",
    "max_line_bytes",
    "max_id_bytes",
    "fan_out",
    "round",
    "slot",
    "read",
)
# The keys a round's plan adds to a shard's (the state layer's PlannedShard holds them)
PLAN_KEYS = ("spot_check_rate", "round", "slot")


def ordered(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data``'s keys in :data:`KEY_ORDER`."""
    return {k: data[k] for k in KEY_ORDER if k in data}


class _Ref(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    shard_id: str
    uri: str
    records: int  # a range's: an estimate until its job read it
    # The count and order-independent digest of the shard's ids, where its writer knew them
    # (sharding, recompaction; a range's once round 0's close read it): the close checks the round's
    # outputs against it without reading them.
    ids: StoredDigest | None = None

    @model_serializer(mode="wrap")
    def _set_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return {k: v for k, v in data.items() if v is not None}

    def to_json(self) -> dict[str, Any]:
        """The stored form: the keys that are set."""
        return self.model_dump(mode="json")


class ShardRef(_Ref):
    """A shard file of its own at ``uri``, of ``records`` records."""

    @property
    def is_range(self) -> bool:
        return False


class Piece(BaseModel):
    """One part file's span in a range shard of a part input (:mod:`~airflow_batchinfer.storage.input_parts`):
    the part's ``uri`` and ``version`` (as planned: checked before the piece is read), and either its
    stored bytes ``range`` ``[start, end)`` (a JSONL part: at line starts; a zstd part: at frame
    starts, with ``lead_in`` as a range's) or its row groups ``rows`` ``[first, end)`` (Parquet)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    uri: str
    version: str
    range: tuple[int, int] | None = None
    lead_in: tuple[int, int] | None = None
    rows: tuple[int, int] | None = None

    @model_serializer(mode="wrap")
    def _set_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return {k: v for k, v in data.items() if v is not None}

    @property
    def whole(self) -> bool:
        """Whether the piece starts at its part's start (its lines are the part's first)."""
        return (self.range or self.rows or (0, 0))[0] == 0


class RangeRef(_Ref):
    """A round-0 range shard: ``uri`` is the input file and ``range`` its stored bytes ``[start, end)``
    (at line starts, or at zstd frame starts), ``bytes`` their number, ``version`` the input's
    ``size:ETag-or-mtime`` the plan is valid for, ``estimated`` true: ``records`` is an estimate and
    ``ids`` is absent until the job that reads the range reports them (round 0's close fills both
    in, and ``read``: the range's line counts as read, ``lines``, ``records``, ``blank``, ``skipped``,
    ``quarantined``). A zstd range after the first has ``lead_in``, the stored bytes of the frame
    before it (frames need not end at a line).

    A part input's range shard (a directory or glob of parts) has ``pieces``: the parts' spans it
    reads, in order (small parts whole, a large one's byte ranges or row groups); ``uri`` is then
    the input's root, ``range`` the shard's place in the parts' stored bytes taken in order (what
    orders the shards), ``version`` absent (each piece pins its part's)."""

    range: tuple[int, int]
    bytes: int | None = None
    version: str | None = None
    estimated: bool | None = None
    lead_in: tuple[int, int] | None = None
    pieces: tuple[Piece, ...] | None = None
    # The readers' line and id bounds (the run's max_line_bytes, max_id_bytes; storage.ranges)
    max_line_bytes: int | None = None
    max_id_bytes: int | None = None
    # The fan-out's arms (storage.fan_out): its lines are read once per arm, ``records`` counts rows
    fan_out: tuple[str, ...] | None = None
    read: dict[str, int] | None = None

    @property
    def is_range(self) -> bool:
        return True

    @property
    def start(self) -> int:
        return self.range[0]

    @property
    def end(self) -> int:
        return self.range[1]

    @property
    def span(self) -> int:
        """The range's stored bytes (``end - start``)."""
        return self.range[1] - self.range[0]

    @property
    def fanned(self) -> FanOut | None:
        """The range's fan-out (``None``: none)."""
        return FanOut.of(self.fan_out)


def _kind(value: Any) -> str:
    if isinstance(value, BaseModel):
        return "range" if isinstance(value, RangeRef) else "file"
    return "range" if isinstance(value, Mapping) and "range" in value else "file"


# A shard of either kind, as a document's field: a stored one with ``range`` is a range shard.
AnyRef = Annotated[Annotated[ShardRef, Tag("file")] | Annotated[RangeRef, Tag("range")], Discriminator(_kind)]
_ANY_REF: TypeAdapter[ShardRef | RangeRef] = TypeAdapter(AnyRef)


def parse_ref(data: Mapping[str, Any] | ShardRef | RangeRef) -> ShardRef | RangeRef:
    """A stored shard (XCom, a document) as its ref; a ref as it is."""
    if isinstance(data, ShardRef | RangeRef):
        return data
    return _ANY_REF.validate_python(dict(data))
