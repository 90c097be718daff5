"""Issue 38: a part input's range job reads part files besides its input (``params.input_range.pieces``):
a worker checks each against its allowed prefixes at submit, as it checks the input (403, naming it)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from airflow_batchinfer.engines import create_engine
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage.ranges import range_params
from airflow_batchinfer.storage.shard_ref import Piece, RangeRef
from airflow_batchinfer.worker.app import create_app
from airflow_batchinfer.worker.config import WorkerConfig
from airflow_batchinfer.worker.runtime import Runtime

pytestmark = pytest.mark.security

TOKEN = "t" * 32


def test_a_piece_outside_the_allowed_prefixes_is_refused_at_submit(tmp_path: Path) -> None:
    data, outside = tmp_path / "data", tmp_path / "elsewhere" / "secret.jsonl"
    pieces = (Piece(uri=str(data / "part-0.jsonl"), version="1:x", range=(0, 1)),)
    shard = RangeRef(
        shard_id="part-00000",
        uri=str(data),
        records=1,
        range=(0, 2),
        pieces=(*pieces, Piece(uri=str(outside), version="1:x", range=(0, 1))),
    )
    layout = RunLayout(str(tmp_path / "run"))
    spec = JobSpec(
        job_id="infer-part-00000",
        kind="infer",
        input=shard.uri,
        outputs={
            "inferred": layout.inferred(0, shard.shard_id),
            "manifest": layout.job_manifest(0, shard.shard_id, "infer"),
            "input_rejects": layout.range_rejects(0, shard.shard_id),
        },
        params={"prompt_template": "{{ q }}", **range_params(shard, id_field="id", assign_ids=False)},
    )

    async def main() -> httpx.Response:
        config = WorkerConfig(token=TOKEN, allowed_prefixes=[str(data), str(tmp_path / "run")])
        runtime = Runtime(create_engine("simulated", latency_base_s=0.0), batch_timeout_s=0.001)
        await runtime.start()
        try:
            transport = httpx.ASGITransport(app=create_app(config, runtime))
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(transport=transport, base_url="http://w", headers=headers) as c:
                return await c.post("/v1/jobs", json=spec.model_dump())
        finally:
            await runtime.close()

    r = asyncio.run(main())
    assert r.status_code == 403 and str(outside) in r.json()["detail"]
