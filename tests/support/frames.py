"""Byte-range frames for the ranged-read tests: a sink that keeps what was read, a file of framed records."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import zstandard

from airflow_batchinfer.storage.range_plan import plan_ranges
from airflow_batchinfer.storage.ranges import read_range


class Sink(list[dict[str, Any]]):
    def write(self, row: dict[str, Any]) -> None:
        self.append(row)


def frames_file(path: Path, data: bytes, cuts: list[int]) -> None:
    """A multi-frame zstd file, frames cut at ``cuts`` (anywhere: not at line ends), as pzstd does."""
    cctx = zstandard.ZstdCompressor()
    bounds = [0, *cuts, len(data)]
    path.write_bytes(b"".join(cctx.compress(data[a:b]) for a, b in itertools.pairwise(bounds)))


def read_all(src: str, rps: int, **kw: Any) -> tuple[list[Any], Sink, list[Any]]:
    plan = plan_ranges(src, records_per_shard=rps, max_bytes_per_shard=1 << 30)
    assert plan is not None
    ids, rejects = [], Sink()
    for shard in plan.shards:
        ids += [r["id"] for r in read_range(shard, id_field="id", assign_ids=False, rejects=rejects, **kw)]
    return ids, rejects, plan.shards
