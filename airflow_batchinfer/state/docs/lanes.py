"""What a round's lanes write (:mod:`airflow_batchinfer.run.lanes`): one claim per shard a lane took
(``round-NN/claims/<shard>.json``, :class:`ShardClaim`) and one status document per lane
(``round-NN/lanes/lane-NNNN.json``, :class:`LaneDoc`): which shards it took, and how each ended. The
report and the review desk show a round's shards from the lane documents, since the Airflow grid
shows one box per lane, not per shard."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from airflow_batchinfer.state.docs.io import DocModel, read_model
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage.files import names
from airflow_batchinfer.storage.json_doc import write_bytes
from airflow_batchinfer.storage.location import StorageOptions, resolve

DOC_THREADS = 16  # lane documents read at once

ShardState = Literal["claimed", "running", "done", "failed"]


class ShardClaim(DocModel):
    """Who took a shard this round: created once, never replaced (a conditional create)."""

    shard_id: str
    lane: int
    token: str  # the claiming call's nonce: tells the winner of a race from the loser
    claimed_at: float


class LaneShard(BaseModel):
    """One shard a lane took and how it went (times: Unix seconds)."""

    model_config = ConfigDict(extra="forbid")
    shard_id: str
    records: int
    state: ShardState
    claimed_at: float
    ended_at: float | None = None
    error: str | None = None  # a failed shard's last job error (close quarantines it)


class LaneDoc(DocModel):
    """A lane's shards in the order it took them; ``claiming`` is the shard it is about to claim
    (written first, so a lane restarted between its claim and this document finds its claim)."""

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset({"claiming"})

    round: int
    slot: str
    lane: int
    lanes: int
    shards: list[LaneShard] = Field(default_factory=list)
    claiming: str | None = None
    finished: bool = False  # no shard was left to take

    def shard(self, shard_id: str) -> LaneShard | None:
        return next((s for s in self.shards if s.shard_id == shard_id), None)


_CLAIM = TypeAdapter(ShardClaim)
_LANE = TypeAdapter(LaneDoc)


def read_claim(
    layout: RunLayout, r: int, shard_id: str, so: StorageOptions | None = None, *, judge: bool = False
) -> ShardClaim | None:
    return read_model(_CLAIM, layout.claim(r, shard_id, judge=judge), "shard claim", so)


def listed_now(uri: str, so: StorageOptions | None) -> list[str]:
    """The names in ``uri`` as the store holds them now: fsspec keeps an object store's listings
    (s3fs's ``dircache``) and another process's claims never invalidate it, so a lane stealing from
    a cached listing would try the same claimed shards forever."""
    loc = resolve(uri, so)
    loc.fs.invalidate_cache(loc.path)
    return names(uri, so)


def claimed_shards(
    layout: RunLayout, r: int, so: StorageOptions | None = None, *, judge: bool = False
) -> set[str]:
    """The ids of round ``r``'s claimed shards (one fresh listing, no document read)."""
    listed = listed_now(layout.claims(r, judge=judge), so)
    return {n.removesuffix(".json") for n in listed if n.endswith(".json")}


def read_lane(
    layout: RunLayout, r: int, lane: int, so: StorageOptions | None = None, *, judge: bool = False
) -> LaneDoc | None:
    return read_model(_LANE, layout.lane(r, lane, judge=judge), "lane status", so)


def write_lane(
    layout: RunLayout, doc: LaneDoc, so: StorageOptions | None = None, *, judge: bool = False
) -> None:
    write_bytes(resolve(layout.lane(doc.round, doc.lane, judge=judge), so), doc.encode())


def read_lanes(
    layout: RunLayout, r: int, so: StorageOptions | None = None, *, judge: bool = False
) -> list[LaneDoc]:
    """Every lane document of round ``r`` (a judge pool's lanes': ``judge``), by lane, read in
    parallel (an object store answers them so: 320 lanes are not 320 requests in a row)."""
    indexes = sorted(
        int(n[len("lane-") : -len(".json")])
        for n in listed_now(layout.lanes(r, judge=judge), so)
        if n.startswith("lane-") and n.endswith(".json") and n[len("lane-") : -len(".json")].isdigit()
    )
    if not indexes:
        return []
    with ThreadPoolExecutor(min(DOC_THREADS, len(indexes))) as ex:
        found = list(ex.map(lambda i: read_lane(layout, r, i, so, judge=judge), indexes))
    return [d for d in found if d is not None]
