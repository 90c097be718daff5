"""An in-place job over a 20,000-record shard on the S3 server, run by a real worker with the
SIMULATED engine: thousands of samples in flight finish into the same two writers at once, and
every input id comes out exactly once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from airflow_batchinfer.state.docs import read_job_manifest
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlFile, shard_dataset
from tests.support.seaweedfs import S3Server
from tests.support.worker_failures import in_place_spec
from tests.support.workers import start_worker

pytestmark = [pytest.mark.s3, pytest.mark.slow]

N = 20_000


def test_in_place_job_of_20k_samples_on_s3_outputs_every_id_once(tmp_path: Path, s3_server: S3Server) -> None:
    root = f"s3://{s3_server.bucket}/in-place-scale-{tmp_path.name}"
    options = s3_server.storage_options()
    src = JsonlFile(f"{root}/source/data.jsonl.zst", storage_options=options)
    with src.writer_sync() as out:
        out.write_many({"id": f"r{i}", "q": f"question {i}"} for i in range(N))
    layout = RunLayout(root)
    (shard,) = shard_dataset(src.uri, layout.input, storage_options=options).shards
    assert shard.records == N
    spec = in_place_spec(
        layout,
        shard,
        "in-place-scale",
        chunk_size=2_000,  # thousands of samples finish into the two writers at once
        max_attempts=3,
        input_records=N,
        checkpoint_every=2_000,
    )
    spec.outputs["staging"] = layout.staging(0)  # fenced, as the DAG runs it: outputs staged per attempt
    env = {
        "AWS_ACCESS_KEY_ID": s3_server.key,
        "AWS_SECRET_ACCESS_KEY": s3_server.secret,
        "AWS_ENDPOINT_URL": s3_server.endpoint_url,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    # Half the verdicts reject, so both outputs get thousands of rows. One engine batch holds the
    # whole window: its samples finish in bursts of ~2,000, and blocks drain while others queue.
    w = start_worker(
        tmp_path,
        allow=[root],
        env=env,
        engine_args={"latency_base_s": 0.001, "latency_per_token_s": 0.0, "approval_rate": 0.5},
        extra=["--max-batch-size", "2000", "--target-batch-tokens", "1000000"],
    )
    try:
        status = w.wait(w.submit(spec).job_id, timeout=120)
        assert status.state == "succeeded", f"{status.error}\n{w.log_tail()}"
    finally:
        code = w.stop()
    assert code == 0, w.log_tail()  # e.g. not killed by a signal (-11: a crash in the writers)

    manifest = read_job_manifest(spec.outputs["manifest"], options)
    assert manifest is not None and manifest.state == "succeeded" and manifest.committed is not None
    staged = manifest.committed  # what the round's close would promote
    assert all(uri.startswith(layout.staging(0)) for uri in staged.values())
    approved = list(JsonlFile(staged["approved"], storage_options=options).iter_records())
    rejected = list(JsonlFile(staged["rejected"], storage_options=options).iter_records())
    ids = Counter(r["id"] for r in approved + rejected)
    assert ids == Counter(f"r{i}" for i in range(N)), (
        f"missing {N - len(ids)}, duplicated {sum(1 for c in ids.values() if c > 1)}"
    )
    assert {r["status"] for r in approved} == {"approved"}
    assert {r["status"] for r in rejected} <= {"max_attempts", "error"}
    assert status.progress.done == N

    counts = manifest.counts.outcomes
    assert counts.approved == len(approved) > N // 2
    assert counts.max_attempts + counts.error == len(rejected) > 1_000
    assert counts.approved + counts.max_attempts + counts.error == N
    assert N < counts.attempts <= 3 * N and manifest.counts.resume.samples == 0
