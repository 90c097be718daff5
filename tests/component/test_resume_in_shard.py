"""Resume inside a shard with real worker processes (issue 24 item 1): a worker SIGKILLed in the
middle of an infer job loses at most the chunks it had in flight. A new worker, given the same job
(same job id), takes the committed segments as they are, infers only the rest, and the job's outputs
hold every input id once, with the digests its manifest records. Local disk and the S3 server."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.state.docs import read_job_manifest
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlFile, files, shard_dataset
from airflow_batchinfer.storage.digest import file_digest
from airflow_batchinfer.storage.location import join, resolve
from airflow_batchinfer.worker.segments import live_name, read_segment
from tests.support.roots import Root
from tests.support.workers import WorkerProcess, start_worker

pytestmark = pytest.mark.slow

N = 6_000
CHUNK = 200  # the first chunk too (FIRST_CHUNK is larger): 30 chunks
ENGINE = {"latency_base_s": 0.05, "latency_per_token_s": 0.0, "approval_rate": 0.6}  # ~0.1 s a chunk
FLAGS = ["--max-batch-size", "100"]


@pytest.fixture
def worker_env(root: Root, request: pytest.FixtureRequest) -> dict[str, str]:
    return request.getfixturevalue("s3_server").env() if root.backend == "s3" else {}


def infer_spec(root: Root) -> JobSpec:
    so = root.storage_options
    src = JsonlFile(root.uri("source", "data.jsonl.zst"), storage_options=so)
    with src.writer_sync() as out:
        out.write_many({"id": f"r{i:05d}", "q": f"question {i}"} for i in range(N))
    layout = RunLayout(root.uri("run"))
    (shard,) = shard_dataset(src.uri, layout.input, records_per_shard=N, storage_options=so).shards
    sid = shard.shard_id
    return JobSpec(
        job_id=f"resume-{sid}-infer",
        kind="infer",
        input=shard.uri,
        outputs={
            "inferred": layout.inferred(0, sid),
            "manifest": layout.job_manifest(0, sid, "infer"),
            "staging": layout.staging(0),
            "segments": layout.segments(0, sid, "infer"),
        },
        params={"prompt_template": "{{ q }}", "chunk_size": CHUNK, "input_records": N},
    )


def committed_records(spec: JobSpec, root: Root) -> tuple[int, int]:
    """Segment documents in the job's directory now, and the input records they cover."""
    seg = spec.outputs["segments"]
    names = listing(seg, root)
    docs = [read_segment(join(seg, n), root.storage_options) for n in names if n.endswith(".json")]
    return len(docs), sum(d.records for d in docs if d is not None)


def listing(uri: str, root: Root) -> list[str]:
    """The names under ``uri`` as stored now (s3fs caches listings)."""
    loc = resolve(uri, root.storage_options)
    loc.fs.invalidate_cache(loc.path)
    return files.names(uri, root.storage_options)


def start(tmp_path: Path, root: Root, env: dict[str, str]) -> WorkerProcess:
    return start_worker(tmp_path, engine_args=ENGINE, extra=FLAGS, env=env, allow=[root.base])


def test_a_worker_killed_mid_job_costs_at_most_the_chunks_in_flight(
    tmp_path: Path, root: Root, worker_env: dict[str, str]
) -> None:
    so = root.storage_options
    spec = infer_spec(root)
    first = start(tmp_path / "w1", root, worker_env)  # the worker dirs sit inside the local root
    try:
        first.submit(spec)
        deadline = time.monotonic() + 120
        while committed_records(spec, root)[0] < 2:
            assert first.status(spec.job_id).state == "running", first.log_tail()
            assert time.monotonic() < deadline, "no two segments committed in 120 s"
            time.sleep(0.02)
        os.kill(first.process.pid, signal.SIGKILL)  # the worker is lost: no drain, no cleanup
        first.process.wait()
    finally:
        first.stop()
    assert read_job_manifest(spec.outputs["manifest"], so) is None
    docs, kept = committed_records(spec, root)
    assert docs >= 2 and kept < N, "the kill came after the job had finished"

    second = start(tmp_path / "w2", root, worker_env)
    try:
        status = second.wait(second.submit(spec).job_id, timeout=180)
        assert status.state == "succeeded", f"{status.error}\n{second.log_tail()}"
        inferred = second.http("GET", "/v1/stats").json()["batcher"]["total_completed"]
    finally:
        assert second.stop() == 0, second.log_tail()

    m = read_job_manifest(spec.outputs["manifest"], so)
    assert m is not None and m.committed is not None and m.ids is not None
    resumed = m.counts.resume.records
    assert resumed >= kept  # every segment committed before the kill was used
    assert inferred <= N - resumed + CHUNK
    assert inferred == N - resumed  # nothing that came from a segment was inferred again
    assert m.counts.resume.segments == (N - resumed) // CHUNK
    assert status.progress.done == N
    assert m.counts.generated.ok == N

    out = JsonlFile(m.committed["inferred"], storage_options=so)
    ids = Counter(r["id"] for r in out.iter_records())
    assert ids == Counter(f"r{i:05d}" for i in range(N))  # the id invariant: each input id once
    assert file_digest(out, "id") == m.ids["inferred"].digest() == m.ids["input"].digest()
    # the killed attempt's live mark keeps the directory for the round's close; the second unmarked itself
    marks = [n for n in listing(spec.outputs["segments"], root) if n.endswith(".live")]
    assert len(marks) == 1 and marks[0] != live_name(m.attempt)
