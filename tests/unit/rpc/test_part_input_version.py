"""A part shard's job is pinned to its pieces (the parts' spans and versions planning pinned), not to
its input's root directory: a file added beside the parts between submit and close does not make the
close think the job stale, while a part rewritten since planning does."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from airflow_batchinfer.rpc.fingerprint import fingerprint, pin_input, spec_input_info
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.rpc.pool import PoolClient
from airflow_batchinfer.storage.ranges import range_params
from airflow_batchinfer.storage.shard_ref import Piece, RangeRef
from tests.support.parts import plan_input, write_parts


def part_spec(tmp_path: Path) -> JobSpec:
    write_parts(tmp_path / "data", [50, 50])
    shard = plan_input(tmp_path / "data", tmp_path / "run", 1000)[0][0]
    assert isinstance(shard, RangeRef) and shard.pieces and shard.uri == str(tmp_path / "data")
    params = range_params(shard, id_field="id", assign_ids=False)
    outputs = {"inferred": str(tmp_path / "o.jsonl"), "manifest": str(tmp_path / "m.json")}
    return JobSpec(job_id="r0-part-00000-x", kind="infer", input=shard.uri, outputs=outputs, params=params)


def test_a_file_added_beside_the_parts_changes_no_part_job_id(tmp_path: Path) -> None:
    spec = part_spec(tmp_path)
    before = pin_input(spec, spec_input_info(spec, None))
    time.sleep(0.02)
    (tmp_path / "data" / "part-99.jsonl").write_bytes(b'{"id": "late"}\n' * 1000)
    after = pin_input(spec, spec_input_info(spec, None))
    assert after.job_id == before.job_id
    assert after.params["input_version"] == before.params["input_version"]
    pool = PoolClient(["http://a:1"], token="tok")
    assert asyncio.run(pool.pinned(spec)).job_id == before.job_id  # the client pins the same way
    info = spec_input_info(spec, None)
    assert fingerprint(spec, {}, info) == fingerprint(spec, {}, spec_input_info(spec, None))


def test_a_part_rewritten_since_planning_changes_the_input_version(tmp_path: Path) -> None:
    spec = part_spec(tmp_path)
    rng = spec.params["input_range"]
    piece = Piece.model_validate(rng["pieces"][0])
    moved = piece.model_copy(update={"version": piece.version + "-other"}).model_dump(mode="json")
    other = spec.model_copy(
        update={"params": {"input_range": {**rng, "pieces": [moved, *rng["pieces"][1:]]}}}
    )
    version = pin_input(spec, spec_input_info(spec, None)).params["input_version"]
    assert pin_input(other, spec_input_info(other, None)).params["input_version"] != version
