"""Issue 38: a DAG whose default ``input`` is a glob or one Parquet file lets its pool read its range
jobs: the pool's read prefixes (:attr:`TriggerLimits.input_read_prefixes`) admit each job's input and
its pieces, as a worker checks them at submit, while a trigger's ``input`` is still checked against
the default as written."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_batchinfer.spec.limits import implied_by, refusals
from airflow_batchinfer.storage.range_plan import shard_ranges
from airflow_batchinfer.storage.ranges import piece_uris, range_params
from airflow_batchinfer.storage.shard_ref import RangeRef
from airflow_batchinfer.worker.security import PrefixPolicy
from tests.support.parts import parquet_part, read_shards, write_parts

pytestmark = pytest.mark.security


@pytest.mark.parametrize("layout", ["glob", "one parquet file"])
def test_the_pool_may_read_the_range_jobs_of_a_glob_or_one_parquet_file(tmp_path: Path, layout: str) -> None:
    pytest.importorskip("pyarrow")
    data = tmp_path / "data"
    if layout == "glob":
        write_parts(data, [50, 50, 50])
        default = str(data / "part-*.jsonl")
    else:
        parquet_part(data / "one.parquet", 0, 300, group=100)
        default = str(data / "one.parquet")
    (data / "beside.jsonl").write_text('{"id": "other"}\n')  # not the default's
    limits = implied_by({"input": default, "output_root": str(tmp_path / "runs")})
    planned = shard_ranges(
        default,
        str(tmp_path / "runs" / "r" / "input"),
        records_per_shard=60,
        max_bytes_per_shard=1 << 30,
        id_field="id",
        assign_ids=False,
    )
    assert planned is not None and len(planned[0]) > 1
    policy = PrefixPolicy([*limits.input_read_prefixes, *limits.allowed_output_prefixes])
    for shard in planned[0]:
        assert isinstance(shard, RangeRef) and shard.pieces
        uris = [shard.uri, *piece_uris(range_params(shard, id_field="id", assign_ids=False))]
        assert [policy.why_not(u) for u in uris] == [None] * len(uris), uris
    assert len(read_shards(planned[0])[0]) == (150 if layout == "glob" else 300)
    # a trigger may choose the default, nothing beside it
    assert refusals({"input": default}, limits) == []
    assert refusals({"input": str(data / "beside.jsonl")}, limits)
    assert refusals({"input": str(tmp_path / "elsewhere" / "x.jsonl")}, limits)
