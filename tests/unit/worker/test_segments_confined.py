"""A job's segments directory (``outputs["segments"]``, resume inside a shard) is an output like any
other: outside the worker's allowed prefixes it is refused at submit (403, nothing written), and a
directory swapped for a symlink that leads out is refused while the job runs (the job fails with the
reason; nothing lands outside)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from airflow_batchinfer.engines import create_engine
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.state.params import parse_params
from airflow_batchinfer.storage import shard_dataset
from airflow_batchinfer.worker.app import create_app
from airflow_batchinfer.worker.config import WorkerConfig
from airflow_batchinfer.worker.registry import JobRegistry
from airflow_batchinfer.worker.runtime import Runtime
from airflow_batchinfer.worker.security import PrefixPolicy

pytestmark = pytest.mark.security

TOKEN = "t" * 32


def infer_spec(tmp_path: Path, segments: Path) -> JobSpec:
    src = tmp_path / "run" / "data.jsonl"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text("".join(json.dumps({"id": f"r{i}", "q": f"{i}"}) + "\n" for i in range(30)))
    layout = RunLayout(str(tmp_path / "run"))
    shard = shard_dataset(str(src), layout.input).shards[0]
    sid = shard.shard_id
    return JobSpec(
        job_id=f"infer-{sid}",
        kind="infer",
        input=shard.uri,
        outputs={
            "inferred": layout.inferred(0, sid),
            "manifest": layout.job_manifest(0, sid, "infer"),
            "staging": layout.staging(0),
            "segments": str(segments),
        },
        params={"prompt_template": "{{ q }}", "chunk_size": 10},
    )


def test_a_segments_directory_outside_the_allowed_prefixes_is_refused_at_submit(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere" / "segments"
    spec = infer_spec(tmp_path, outside)

    async def main() -> httpx.Response:
        config = WorkerConfig(token=TOKEN, allowed_prefixes=[str(tmp_path / "run")])
        runtime = Runtime(create_engine("simulated", latency_base_s=0.0), batch_timeout_s=0.001)
        app = create_app(config, runtime)
        await runtime.start()
        try:
            transport = httpx.ASGITransport(app=app)
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(transport=transport, base_url="http://w", headers=headers) as c:
                return await c.post("/v1/jobs", json=spec.model_dump())
        finally:
            await runtime.close()

    r = asyncio.run(main())
    assert r.status_code == 403 and str(outside) in r.json()["detail"]
    assert not (tmp_path / "elsewhere").exists()


def test_a_segments_directory_swapped_for_a_link_out_fails_the_job_and_writes_nothing_there(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    link = tmp_path / "run" / "checkpoints" / "segments"
    spec = infer_spec(tmp_path, link)
    link.parent.mkdir(parents=True)
    link.symlink_to(outside)  # after the submit check: as if swapped while the job was queued

    async def main() -> tuple[str, str | None]:
        runtime = Runtime(create_engine("simulated", latency_base_s=0.0), batch_timeout_s=0.001)
        await runtime.start()
        policy = PrefixPolicy([str(tmp_path / "run")])
        registry = JobRegistry(runtime, concurrency=1, worker_name="w1", policy=policy)
        try:
            registry.submit(spec, parse_params("infer", spec.params))
            task = registry.jobs[spec.job_id].task
            assert task is not None
            await task
            status = registry.status(spec.job_id)
            assert status is not None
            return status.state, status.error
        finally:
            await runtime.close()

    state, error = asyncio.run(main())
    assert state == "failed" and error is not None
    assert "refused while the job ran" in error and "Restore the directory, then retry the shard" in error
    assert list(outside.iterdir()) == []
    assert not Path(spec.outputs["manifest"]).exists()
