"""A round's close writes these: ``round-NN/summary.json`` (:class:`Summary`) and one quarantine
record per shard it quarantined (``round-NN/failed/<shard>.json``, :class:`FailedShard`, also in the
summary's ``failed_shards``)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    model_serializer,
)

from airflow_batchinfer.state.docs.io import Digest, DocModel, read_model
from airflow_batchinfer.state.docs.usage_account import UsageAccount
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage.digest import IdDigest
from airflow_batchinfer.storage.json_doc import write_bytes
from airflow_batchinfer.storage.location import StorageOptions, join, resolve


class RepeatedIds(BaseModel):
    """Ids of a quarantined round-0 range shard that an earlier range holds (rejected once accepted)."""

    model_config = ConfigDict(extra="forbid")
    count: int
    first: str  # the first one: its id, line and first line
    note: str


class UnreadablePart(BaseModel):
    """A piece a quarantined round-0 range shard could not read (a corrupt Parquet row group or zstd
    frame, a part changed or gone since planning), read up to there: the shard accounts for the ids
    read; the piece's ``records`` not read (``None``: unknown, a byte range) have no ids to account for."""

    model_config = ConfigDict(extra="forbid")
    part: str
    row_groups: list[int] | None = None  # Parquet: [first, end)
    range: list[int] | None = None  # stored bytes [start, end)
    records: int | None = None
    error: str


class FailedShard(DocModel):
    """A shard a round's close quarantined (``round-NN/failed/<shard>.json``, and in the summary's
    ``failed_shards``): its whole input (``records``; ``ids`` when known) is accounted for here. A
    round-0 range shard's input is the bytes ``range`` of ``uri``; one with pieces that could not be
    read accounts for the ids read, ``unreadable`` naming those pieces."""

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset({"range", "ids", "repeated_ids", "unreadable"})

    shard_id: str
    uri: str
    records: int
    round: int
    phase: str
    error: str
    orphans_removed: list[str] = Field(default_factory=list)  # final outputs no accepted job produced
    remedy: str
    range: list[int] | None = None
    ids: Digest | None = None
    repeated_ids: RepeatedIds | None = None
    unreadable: list[UnreadablePart] | None = None


class WorkerTotals(BaseModel):
    """One worker's figures over a round's jobs (a summary's ``workers``)."""

    model_config = ConfigDict(extra="forbid")
    jobs: float = 0.0
    job_seconds: float = 0.0
    engine_busy_s: float = 0.0
    fill_sum: float = 0.0  # the jobs' average batch fill, summed (the report divides by ``jobs``)
    tokens: float = 0.0


class Candidates(BaseModel):
    """A round's candidates (sampling ``n`` > 1, :mod:`~airflow_batchinfer.judges.candidates`): the
    ``records`` judged with ``n`` each (in place: the attempts), how many of them had candidate i
    approved (``approved_by_index[i]``), and pass@k for k = 1..n (``pass_at["k"]``)."""

    model_config = ConfigDict(extra="forbid")
    n: int
    records: int
    approved_by_index: list[int]
    pass_at: dict[str, float]


class AdapterApproval(BaseModel):
    """One LoRA adapter's rows in a round: ``approved`` and ``rejected`` (in place: exhausted), and
    ``spot_checks``: the judge's approvals held back for people (neither of the others; stored only
    when there are some). ``approval_rate``: the judge's approvals, spot checks included, of its rows."""

    model_config = ConfigDict(extra="forbid")
    approved: int
    rejected: int
    spot_checks: int = 0
    approval_rate: float

    @model_serializer(mode="wrap")
    def _spot_checks_when_some(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if not data.get("spot_checks"):
            data.pop("spot_checks", None)
        return data


class JuryMember(BaseModel):
    """One jury member's answers in a round: ``approved`` and ``rejected`` by it."""

    model_config = ConfigDict(extra="forbid")
    approved: int
    rejected: int
    approval_rate: float


class Jury(BaseModel):
    """A round's jury (:mod:`~airflow_batchinfer.judges.jury`): the answers it ``voted`` on, those on
    which its members ``split`` (did not all agree; ``disagreement_rate`` of them) and each member's
    approval."""

    model_config = ConfigDict(extra="forbid")
    voted: int
    split: int
    disagreement_rate: float
    members: dict[str, JuryMember]


class Invariant(BaseModel):
    """A round's id check: ``planned`` rows, ``accounted`` for; the ids found lost, doubled or
    unexpected (up to 20 each) and the shards whose files were read (``opened``)."""

    model_config = ConfigDict(extra="forbid")
    planned: int
    accounted: int
    ok: bool
    lost: list[Any] = Field(default_factory=list)
    doubled: list[Any] = Field(default_factory=list)
    unexpected: list[Any] = Field(default_factory=list)
    opened: list[str] = Field(default_factory=list)


class Summary(DocModel):
    """A round's ``summary.json``, written by its close. A ``rounds`` round has ``rejected``,
    ``inference_errors``, ``for_review`` (rejected rows that await people) and ``next_pending``; an
    ``in_place`` one ``exhausted`` and ``attempts``; ``truncated``: the rows (in place: the attempts)
    whose completion was cut at ``max_tokens``, ``truncated_in_thinking`` those of them cut while the
    model was still thinking (omitted when none); ``candidates``: approval per candidate index and pass@k
    when records had several (sampling ``n``); ``adapters``: approval per LoRA adapter, when records
    named one; ``spot_checks``: the approved rows held back for people (``spot_check_approved``),
    ``verdicts``: the judged rows per stratum (``approved``, ``held``, ``rejected``) and score
    bucket, when people check the judge (the calibration's weights); ``jury``: how often a jury's
    members disagreed, and each one's approval. ``ids``: the count and digest of each set's ids
    (``planned``, ``approved``, ``rejected`` or ``exhausted``, ``failed``, ``repeated``,
    ``next_pending``). ``usage``: the run's GPU-seconds up to this close (leased, busy, idle at
    gates and in tails, re-warms, what ``keep`` would have cost: :class:`~.usage_account.UsageAccount`,
    its ``rounds`` ending with this round's own share); the last closed round's is the run's."""

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset(
        {
            "rejected",
            "inference_errors",
            "for_review",
            "next_pending",
            "exhausted",
            "attempts",
            "truncated",
            "truncated_in_thinking",
            "candidates",
            "adapters",
            "spot_checks",
            "verdicts",
            "jury",
            "usage",
        }
    )

    round: int
    slot: str
    mode: Literal["rounds", "in_place"]
    pending: int
    shards: int
    approved: int
    failed_shards: list[FailedShard]
    failed_records: int
    orphans_removed: list[str] = Field(default_factory=list)
    tokens: dict[str, int]
    job_seconds: float
    workers: dict[str, WorkerTotals] = Field(default_factory=dict)
    rejected: int | None = None
    inference_errors: int | None = None
    for_review: int | None = None
    next_pending: int | None = None
    exhausted: int | None = None
    attempts: int | None = None
    truncated: int | None = None
    truncated_in_thinking: int | None = None
    candidates: Candidates | None = None
    adapters: dict[str, AdapterApproval] | None = None
    # judge-approved rows held back for people (spot_check_approved: in for_review and rejected), and
    # the judged rows per stratum and score bucket of a judge people check (judges.spot_check)
    spot_checks: int | None = None
    verdicts: dict[str, dict[str, int]] | None = None
    jury: Jury | None = None
    repeated_ids: int = 0
    approval_rate: float | None
    ids: dict[str, Digest] | None = None
    invariant: Invariant
    usage: UsageAccount | None = None

    def digest(self, name: str) -> IdDigest | None:
        """The digest of the round's set ``name``; ``None`` when the summary has none."""
        d = (self.ids or {}).get(name)
        return None if d is None else d.digest()


_SUMMARY = TypeAdapter(Summary)
_FAILED = TypeAdapter(FailedShard)


def read_summary(layout: RunLayout, r: int, so: StorageOptions | None = None) -> Summary | None:
    """Round ``r``'s summary, or ``None`` when the round has not closed."""
    return read_model(_SUMMARY, layout.summary(r), "round summary", so)


def write_summary(layout: RunLayout, summary: Summary, so: StorageOptions | None = None) -> None:
    write_bytes(resolve(layout.summary(summary.round), so), summary.encode())


def _failed_uri(layout: RunLayout, r: int, shard_id: str) -> str:
    return join(layout.failed(r), f"{shard_id}.json")


def read_failed(
    layout: RunLayout, r: int, shard_id: str, so: StorageOptions | None = None
) -> FailedShard | None:
    """Round ``r``'s quarantine record of ``shard_id``, or ``None`` when the shard is not quarantined."""
    return read_model(_FAILED, _failed_uri(layout, r, shard_id), "quarantine record", so)


def write_failed(layout: RunLayout, record: FailedShard, so: StorageOptions | None = None) -> None:
    write_bytes(resolve(_failed_uri(layout, record.round, record.shard_id), so), record.encode())
