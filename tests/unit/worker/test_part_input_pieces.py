"""Issue 38: a range job's pieces are parts under its input (the range's root, read on its
filesystem). A piece elsewhere, even under the worker's allowed prefixes, and an ``input_range``
that is no description at all are refused at submit as bad requests (400), not read or answered 500."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from airflow_batchinfer.engines import create_engine
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage.ranges import InputRange, range_params
from airflow_batchinfer.storage.shard_ref import Piece, RangeRef
from airflow_batchinfer.worker.app import create_app
from airflow_batchinfer.worker.config import WorkerConfig
from airflow_batchinfer.worker.runtime import Runtime

pytestmark = pytest.mark.security

TOKEN = "t" * 32


def params_of(root: str, *uris: str) -> dict[str, Any]:
    pieces = tuple(Piece(uri=u, version="1:x", range=(0, 1)) for u in uris)
    shard = RangeRef(shard_id="part-00000", uri=root, records=1, range=(0, 2), pieces=pieces)
    return range_params(shard, id_field="id", assign_ids=False)


@pytest.mark.parametrize(
    "piece",
    ["/elsewhere/a.jsonl", "/data2/a.jsonl", "s3://b/data/a.jsonl", "/data/../etc/a.jsonl", "/data//a.jsonl"],
)
def test_a_piece_not_under_the_ranges_root_is_refused(piece: str) -> None:
    raw = params_of("/data", "/data/part-0.jsonl", piece)["input_range"]
    assert InputRange.from_params(raw).pieces  # without a root: parsed (what the pieces are)
    with pytest.raises(ConfigError, match=r"piece .* is not a part under the range's input /data"):
        InputRange.from_params(raw, root="/data")


def test_pieces_under_the_root_or_one_file_its_own_root_are_accepted() -> None:
    raw = params_of("s3://b/data", "s3://b/data/x/part-0.jsonl")["input_range"]
    assert InputRange.from_params(raw, root="s3://b/data/").pieces
    one = params_of("/data/one.parquet", "/data/one.parquet")["input_range"]
    assert InputRange.from_params(one, root="/data/one.parquet").pieces


def submit(tmp_path: Path, params: dict[str, Any], root: str) -> httpx.Response:
    layout = RunLayout(str(tmp_path / "run"))
    spec = JobSpec(
        job_id="infer-part-00000",
        kind="infer",
        input=root,
        outputs={
            "inferred": layout.inferred(0, "part-00000"),
            "manifest": layout.job_manifest(0, "part-00000", "infer"),
            "input_rejects": layout.range_rejects(0, "part-00000"),
        },
        params={"prompt_template": "{{ q }}", **params},
    )

    async def main() -> httpx.Response:
        config = WorkerConfig(token=TOKEN, allowed_prefixes=[str(tmp_path)])
        runtime = Runtime(create_engine("simulated", latency_base_s=0.0), batch_timeout_s=0.001)
        await runtime.start()
        try:
            transport = httpx.ASGITransport(app=create_app(config, runtime))
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(transport=transport, base_url="http://w", headers=headers) as c:
                return await c.post("/v1/jobs", json=spec.model_dump())
        finally:
            await runtime.close()

    return asyncio.run(main())


def test_a_piece_outside_its_input_is_a_bad_request_even_under_the_allowed_prefixes(tmp_path: Path) -> None:
    data, other = tmp_path / "data", tmp_path / "other" / "secret.jsonl"
    r = submit(tmp_path, params_of(str(data), str(data / "part-0.jsonl"), str(other)), str(data))
    assert r.status_code == 400 and str(other) in r.json()["detail"]


@pytest.mark.parametrize("bad", [["not", "a", "range"], "a string", {"pieces": "nope"}])
def test_an_input_range_that_is_no_description_is_a_bad_request(tmp_path: Path, bad: Any) -> None:
    r = submit(tmp_path, {"input_range": bad}, str(tmp_path / "data"))
    assert r.status_code == 400 and "input_range" in r.json()["detail"]
