"""Every shard of a round run by lanes, and its state, from what the lanes and the close wrote: the
lane documents (``round-NN/lanes/``, :class:`~airflow_batchinfer.state.docs.lanes.LaneDoc`), the
claims (``round-NN/claims/``) and the quarantine records (``round-NN/failed/``). The Airflow grid
shows one box per lane; the run report and the review desk show each shard from here.

A shard's state (:data:`ShardState`):

- ``done`` / ``failed``: its lane ended it so; a shard the round's close quarantined is ``failed``
  whatever its lane said (``quarantine`` names its record, ``error`` is the close's);
- ``running``: its lane runs it; ``claimed``: claimed, and no lane has recorded it yet (a lane
  that stopped between its claim and its document: its restart takes it back). Both are
  *unfinished*;
- ``unclaimed``: no lane has taken it yet.

:func:`round_status` reads O(lanes) documents (in parallel) and lists two folders; a claim is read
only for a shard no lane document names. A round with no lane document and no claim has not
started: :attr:`RoundStatus.started` is ``False``.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from airflow_batchinfer.state.docs.lanes import (
    DOC_THREADS,
    LaneDoc,
    LaneShard,
    claimed_shards,
    listed_now,
    read_claim,
    read_lanes,
)
from airflow_batchinfer.state.docs.plan import Plan
from airflow_batchinfer.state.docs.summary import FailedShard, read_failed
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage.location import StorageOptions, join

ShardState = Literal["done", "failed", "running", "claimed", "unclaimed"]
# What the counts group the states into (running and claimed: unfinished).
COUNTED = ("done", "failed", "unfinished", "unclaimed")
GROUP: dict[str, str] = {
    "done": "done",
    "failed": "failed",
    "running": "unfinished",
    "claimed": "unfinished",
    "unclaimed": "unclaimed",
}
MAX_LISTED = 100  # failed and unfinished shards the figures name per round (the counts are whole)


class ShardRow(BaseModel):
    """One shard of the round (times: Unix seconds). ``index``: its place in the plan."""

    model_config = ConfigDict(extra="forbid")
    shard_id: str
    index: int
    records: int
    state: ShardState
    lane: int | None = None
    claimed_at: float | None = None
    ended_at: float | None = None
    error: str | None = None
    quarantine: str | None = None  # its quarantine record's URI, when the close quarantined it

    @property
    def group(self) -> str:
        return GROUP[self.state]


class LaneFigures(BaseModel):
    """One lane's shards: how many it took and how they ended, the records of those it finished,
    and its busy time (claimed to ended, summed over the shards it ended)."""

    model_config = ConfigDict(extra="forbid")
    lane: int
    shards: int
    done: int
    failed: int
    unfinished: int
    records: int
    busy_s: float
    finished: bool  # it found no shard left to take


class FailedRow(BaseModel):
    """A failed shard as the figures name it: its lane (``None``: never claimed), its error and its
    quarantine record (``None``: not quarantined yet, the round has not closed)."""

    model_config = ConfigDict(extra="forbid")
    shard_id: str
    lane: int | None
    error: str | None
    quarantine: str | None


class RoundShards(BaseModel):
    """A round's shards in figures (the report's ``shard_status``): ``counts`` by :data:`COUNTED`,
    one :class:`LaneFigures` per lane document, the failed shards with their errors and the
    unfinished ones' ids (up to :data:`MAX_LISTED` each; ``failed_count`` and the counts are whole)."""

    model_config = ConfigDict(extra="forbid")
    round: int
    slot: str
    shards: int
    records: int
    lanes: int
    counts: dict[str, int]
    busy_s: float
    lane_figures: list[LaneFigures] = Field(default_factory=list)
    failed: list[FailedRow] = Field(default_factory=list)
    failed_count: int = 0
    unfinished: list[str] = Field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return self.model_dump(mode="json")

    def spread(self) -> dict[str, tuple[float, float, float]]:
        """Shards and busy seconds per lane: (least, median, most)."""
        out: dict[str, tuple[float, float, float]] = {}
        for name in ("shards", "busy_s"):
            values = [float(getattr(f, name)) for f in self.lane_figures]
            if values:
                out[name] = (min(values), statistics.median(values), max(values))
        return out


@dataclass(frozen=True)
class RoundStatus:
    """Round ``plan.round``'s shards in the plan's order, with the lane documents they came from."""

    plan: Plan
    rows: list[ShardRow]
    lane_docs: list[LaneDoc]
    claimed: frozenset[str]

    @property
    def started(self) -> bool:
        """Whether a lane has taken a shard of the round."""
        return bool(self.lane_docs or self.claimed)

    def counts(self, rows: Iterable[ShardRow] | None = None) -> dict[str, int]:
        out = dict.fromkeys(COUNTED, 0)
        for row in self.rows if rows is None else rows:
            out[row.group] += 1
        return out

    def figures(self) -> RoundShards:
        by_lane: dict[int, list[ShardRow]] = {}
        for row in self.rows:
            if row.lane is not None:
                by_lane.setdefault(row.lane, []).append(row)
        lanes = []
        for doc in self.lane_docs:
            mine = by_lane.get(doc.lane, [])
            ended = [r for r in mine if r.claimed_at is not None and r.ended_at is not None]
            lanes.append(
                LaneFigures(
                    lane=doc.lane,
                    shards=len(mine),
                    done=sum(1 for r in mine if r.state == "done"),
                    failed=sum(1 for r in mine if r.state == "failed"),
                    unfinished=sum(1 for r in mine if r.group == "unfinished"),
                    records=sum(r.records for r in mine if r.state == "done"),
                    busy_s=round(sum(_busy(r) for r in ended), 3),
                    finished=doc.finished,
                )
            )
        failed = [r for r in self.rows if r.state == "failed"]
        return RoundShards(
            round=self.plan.round,
            slot=self.plan.slot,
            shards=len(self.rows),
            records=sum(r.records for r in self.rows),
            lanes=len(self.lane_docs),
            counts=self.counts(),
            busy_s=round(sum(f.busy_s for f in lanes), 3),
            lane_figures=lanes,
            failed=[
                FailedRow(shard_id=r.shard_id, lane=r.lane, error=r.error, quarantine=r.quarantine)
                for r in failed[:MAX_LISTED]
            ],
            failed_count=len(failed),
            unfinished=[r.shard_id for r in self.rows if r.group == "unfinished"][:MAX_LISTED],
        )


def _busy(row: ShardRow) -> float:
    assert row.claimed_at is not None and row.ended_at is not None
    return max(row.ended_at - row.claimed_at, 0.0)


def quarantined(layout: RunLayout, r: int, so: StorageOptions | None = None) -> set[str]:
    """The ids of the shards round ``r``'s close quarantined (one listing of ``failed/``)."""
    return {n.removesuffix(".json") for n in listed_now(layout.failed(r), so) if n.endswith(".json")}


def _latest(docs: Iterable[LaneDoc]) -> dict[str, tuple[int, LaneShard]]:
    """Each shard's entry with its lane: a shard in two lane documents (a lane's restart under another
    count left its old one) is the later claim's."""
    entries: dict[str, tuple[int, LaneShard]] = {}
    for doc in docs:
        for entry in doc.shards:
            seen = entries.get(entry.shard_id)
            if seen is None or entry.claimed_at >= seen[1].claimed_at:
                entries[entry.shard_id] = (doc.lane, entry)
    return entries


def round_status(
    layout: RunLayout,
    plan: Plan,
    so: StorageOptions | None = None,
    *,
    failed: Iterable[FailedShard] | None = None,
) -> RoundStatus:
    """The state of every shard of ``plan``'s round. ``failed``: the round's quarantine records when
    the caller has them (its summary's ``failed_shards``); else those ``failed/`` lists are read."""
    r = plan.round
    docs = read_lanes(layout, r, so)
    claimed = frozenset(claimed_shards(layout, r, so))
    records: dict[str, FailedShard] = {f.shard_id: f for f in failed or ()}
    if failed is None:
        listed = sorted(quarantined(layout, r, so))
        if listed:
            with ThreadPoolExecutor(min(DOC_THREADS, len(listed))) as ex:
                got = list(ex.map(lambda sid: read_failed(layout, r, sid, so), listed))
            records = {f.shard_id: f for f in got if f is not None}
    entries = _latest(docs)
    # A judge on its own pool: a shard's judge lane entry, once its inference is done, says the rest.
    judged = _latest(read_lanes(layout, r, so, judge=True)) if plan.judge_engine is not None else None
    rows = []
    for index, shard in enumerate(plan.shards):
        sid = shard.shard_id
        row = ShardRow(shard_id=sid, index=index, records=int(shard.records), state="unclaimed")
        if sid in entries:
            lane, entry = entries[sid]
            row.state, row.lane = entry.state, lane
            row.claimed_at, row.ended_at, row.error = entry.claimed_at, entry.ended_at, entry.error
            if judged is not None and entry.state == "done":
                judge = judged.get(sid)
                row.state = "running" if judge is None else judge[1].state  # inferred: judged next
                row.ended_at = None if judge is None else judge[1].ended_at
                row.error = None if judge is None else judge[1].error
        elif sid in claimed:
            row.state = "claimed"
            # The claim itself says who holds it: a lane's ``claiming`` may name a race it lost.
            claim = read_claim(layout, r, sid, so)
            row.lane = None if claim is None else claim.lane
            row.claimed_at = None if claim is None else claim.claimed_at
        record = records.get(sid)
        if record is not None:  # the close's word is the last
            row.state, row.error = "failed", record.error
            row.quarantine = join(layout.failed(r), f"{sid}.json")
        rows.append(row)
    return RoundStatus(plan, rows, docs, claimed)
