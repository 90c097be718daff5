"""A real worker process over real HTTP, with the SIMULATED engine (no model): the RPC contract."""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.state.docs import read_job_manifest
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlFile, shard_dataset
from airflow_batchinfer.worker.server import bound_socket
from tests.support.workers import WorkerProcess, start_worker

pytestmark = pytest.mark.slow


def make_run(
    tmp_path: Path, n: int = 300, *, per_shard: int = 1000, extra: dict[str, Any] | None = None
) -> tuple[RunLayout, list[Any]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    src = tmp_path / "data.jsonl"
    src.write_text(
        "".join(
            json.dumps({"id": f"r{i}", "q": f"{i}+{i}", "answer": 2 * i, **(extra or {})}) + "\n"
            for i in range(n)
        )
    )
    layout = RunLayout(str(tmp_path / "run"))
    return layout, shard_dataset(str(src), layout.input, records_per_shard=per_shard).shards


def infer_spec(layout: RunLayout, shard: Any, *, job_id: str | None = None, **params: Any) -> JobSpec:
    sid = shard.shard_id
    return JobSpec(
        job_id=job_id or f"r00-{sid}-infer",
        kind="infer",
        input=shard.uri,
        outputs={"inferred": layout.inferred(0, sid), "manifest": layout.job_manifest(0, sid, "infer")},
        params={"prompt_template": "What is {{ q }}?", "input_records": shard.records, **params},
    )


@pytest.fixture
def worker(tmp_path: Path) -> Any:
    w = start_worker(tmp_path, concurrency=2)
    yield w
    w.stop()


def rows(uri: str) -> list[dict[str, Any]]:
    return list(JsonlFile(uri).iter_records())


def test_infer_job_lifecycle_outputs_and_manifest(tmp_path: Path, worker: WorkerProcess) -> None:
    layout, shards = make_run(tmp_path, 300)
    spec = infer_spec(layout, shards[0], chunk_size=64)
    first = worker.submit(spec)
    assert first.state == "running"
    status = worker.wait(spec.job_id)
    assert status.state == "succeeded", status.error
    assert status.progress.done == status.progress.total == 300
    assert status.counts.model_dump() == {"generated": {"ok": 300}}
    out = rows(spec.outputs["inferred"])
    assert [r["id"] for r in out] == [f"r{i}" for i in range(300)]
    assert all(r["status"] == "ok" and r["result"].startswith("simulated answer") for r in out)
    assert all(r["attempts"] == 1 and r["round"] == 0 and r["error"] is None for r in out)
    manifest = read_job_manifest(spec.outputs["manifest"])
    assert manifest is not None
    assert json.loads(Path(spec.outputs["manifest"]).read_text())["schema_version"] == 2
    assert manifest.state == "succeeded"
    assert manifest.counts.model_dump() == {"generated": {"ok": 300}} and len(manifest.fingerprint) == 64
    assert manifest.batcher.batches >= 1 and 0 <= manifest.batcher.utilization <= 1


def test_same_job_id_never_runs_twice(tmp_path: Path, worker: WorkerProcess) -> None:
    layout, shards = make_run(tmp_path, 100)
    spec = infer_spec(layout, shards[0])
    r1 = worker.http("POST", "/v1/jobs", json=spec.model_dump())
    r2 = worker.http("POST", "/v1/jobs", json=spec.model_dump())
    assert (r1.status_code, r2.status_code) == (202, 200)
    worker.wait(spec.job_id)
    r3 = worker.http("POST", "/v1/jobs", json=spec.model_dump())
    assert r3.status_code == 200 and r3.json()["state"] == "succeeded"
    stats = worker.http("GET", "/v1/stats").json()
    assert stats["jobs"] == {"succeeded": 1}
    assert stats["batcher"]["total_submitted"] == 100  # the records went through once
    # the same id for a different job (another run's outputs) is a conflict, not a stale answer
    other = spec.model_copy(
        update={"outputs": {**spec.outputs, "inferred": str(tmp_path / "elsewhere.jsonl")}}
    )
    r4 = worker.http("POST", "/v1/jobs", json=other.model_dump())
    assert r4.status_code == 409 and "different input, outputs or params" in r4.json()["detail"]


def test_429_when_all_slots_busy(tmp_path: Path) -> None:
    w = start_worker(tmp_path, concurrency=1, engine_args={"latency_base_s": 0.5})
    try:
        layout, shards = make_run(tmp_path, 40, per_shard=20)
        busy = w.http("POST", "/v1/jobs", json=infer_spec(layout, shards[0], chunk_size=5).model_dump())
        assert busy.status_code == 202
        refused = w.http("POST", "/v1/jobs", json=infer_spec(layout, shards[1]).model_dump())
        assert refused.status_code == 429
        assert refused.headers["Retry-After"] and refused.json()["error"] == "busy"
    finally:
        w.stop(signal.SIGKILL)


def test_auth_required_and_nothing_touched(tmp_path: Path, worker: WorkerProcess) -> None:
    layout, shards = make_run(tmp_path, 10)
    spec = infer_spec(layout, shards[0])
    for token in (None, "wrong-token"):
        r = worker.http("POST", "/v1/jobs", token=token, json=spec.model_dump())
        assert r.status_code == 401
        assert worker.http("GET", "/v1/stats", token=token).status_code == 401
        assert worker.http("GET", "/metrics", token=token).status_code == 401
    assert worker.http("GET", f"/v1/jobs/{spec.job_id}").status_code == 404
    assert not Path(spec.outputs["inferred"]).exists()
    assert worker.http("GET", "/v1/health", token=None).status_code == 200  # probes stay open
    assert worker.http("GET", "/v1/ready", token=None).json() == {"ready": True}


def test_403_outside_allowed_prefixes(tmp_path: Path, worker: WorkerProcess) -> None:
    layout, shards = make_run(tmp_path, 10)
    for outside in ("/etc/passwd-out.jsonl", f"{tmp_path}/../escape.jsonl", "s3://other-bucket/x.jsonl"):
        spec = infer_spec(layout, shards[0]).model_copy(
            update={
                "outputs": {"inferred": outside, "manifest": layout.job_manifest(0, "part-00000", "infer")}
            }
        )
        r = worker.http("POST", "/v1/jobs", json=spec.model_dump())
        assert r.status_code == 403, outside
        assert "allowed prefixes" in r.json()["detail"]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"kind": "train"}, "kind"),
        ({"outputs": {"inferred": "x"}}, "needs outputs ['manifest']"),
        ({"job_id": "../../etc"}, "job_id"),
        ({"params": {"prompt_template": "{% if %}"}}, "invalid prompt template"),
        ({"params": {"chunk_size": 0}}, "chunk_size"),
        ({"params": {"sampling": {"temperature": -1}}}, "temperature"),
        ({"unknown_field": 1}, "unknown_field"),
    ],
)
def test_400_names_the_problem(
    tmp_path: Path, worker: WorkerProcess, change: dict[str, Any], reason: str
) -> None:
    layout, shards = make_run(tmp_path, 10)
    body = {**infer_spec(layout, shards[0]).model_dump(), **change}
    r = worker.http("POST", "/v1/jobs", json=body)
    assert r.status_code == 400
    assert reason in r.json()["detail"]


def test_judge_job_needs_a_judge_and_splits_rows(tmp_path: Path, worker: WorkerProcess) -> None:
    layout, shards = make_run(tmp_path, 200, extra={})
    sid = shards[0].shard_id
    # inferred rows: half answered right, some errored
    inferred = JsonlFile(layout.inferred(0, sid))
    with inferred.writer_sync() as w:
        for i in range(200):
            ok = i % 10 != 0
            w.write(
                {
                    "id": f"r{i}",
                    "answer": 2 * i,
                    "result": f"It is {2 * i if i % 2 else 2 * i + 1}." if ok else None,
                    "status": "ok" if ok else "error",
                    "error": None if ok else "boom",
                    "attempts": 1,
                    "round": 0,
                }
            )
    spec = JobSpec(
        job_id="r00-judge",
        kind="judge",
        input=inferred.uri,
        outputs={
            "approved": layout.result(0, sid),
            "rejected": layout.rejected(0, sid),
            "manifest": layout.job_manifest(0, sid, "judge"),
        },
        params={},
    )
    assert worker.http("POST", "/v1/jobs", json=spec.model_dump()).status_code == 400
    spec.params = {"judge": {"type": "expected_answer", "field": "answer", "match": "number"}}
    status = worker.wait(worker.submit(spec).job_id)
    assert status.state == "succeeded", status.error
    approved, rejected = rows(layout.result(0, sid)), rows(layout.rejected(0, sid))
    assert {r["id"] for r in approved} == {f"r{i}" for i in range(200) if i % 2 and i % 10}
    assert len(approved) + len(rejected) == 200
    assert all(r["status"] == "approved" and r["judgment"]["approved"] for r in approved)
    errored = [r for r in rejected if r["id"] in {f"r{i}" for i in range(0, 200, 10)}]
    assert len(errored) == 20 and all(r["judgment"]["reason"].startswith("inference_error") for r in errored)
    assert status.counts.outcomes.inference_errors == 20


def test_in_place_retries_until_approved_or_max_attempts(tmp_path: Path) -> None:
    w = start_worker(tmp_path, engine_args={"approval_rate": 0.5})
    try:
        layout, shards = make_run(tmp_path, 400)
        sid = shards[0].shard_id
        spec = JobSpec(
            job_id="inplace",
            kind="in_place",
            input=shards[0].uri,
            outputs={
                "approved": layout.result(0, sid),
                "rejected": layout.rejected(0, sid),
                "checkpoints": layout.checkpoints(0, sid),
                "manifest": layout.job_manifest(0, sid, "in_place"),
            },
            params={
                "prompt_template": "{{ q }}",
                "judge": {"type": "llm"},
                "max_attempts": 3,
                "chunk_size": 50,
            },
        )
        status = w.wait(w.submit(spec).job_id)
        assert status.state == "succeeded", status.error
        approved, rejected = rows(layout.result(0, sid)), rows(layout.rejected(0, sid))
        assert sorted(r["id"] for r in approved + rejected) == sorted(f"r{i}" for i in range(400))
        assert {r["status"] for r in rejected} == {"max_attempts"}
        assert all(r["attempts"] == 3 for r in rejected)
        assert {r["attempts"] for r in approved} == {1, 2, 3}
        # P(rejected 3 times) = 1/8: about 50 of 400, deterministic by hash
        assert 20 < len(rejected) < 90
        assert status.counts.outcomes.attempts == sum(r["attempts"] for r in approved + rejected)
        assert not list(Path(layout.checkpoints(0, sid)).glob("part-*"))  # cleared after the manifest
    finally:
        w.stop()


def test_one_failing_element_fails_only_its_record_across_concurrent_jobs(tmp_path: Path) -> None:
    w = start_worker(tmp_path, engine_args={"fail_marker": "POISON"})
    try:
        layout, shards = make_run(tmp_path, 200, per_shard=100)
        specs = [
            infer_spec(layout, s, prompt_template="{{ q }}{% if id in ['r7', 'r150'] %} POISON{% endif %}")
            for s in shards
        ]
        for spec in specs:
            w.submit(spec)
        for spec in specs:
            assert w.wait(spec.job_id).state == "succeeded"
        out = rows(specs[0].outputs["inferred"]) + rows(specs[1].outputs["inferred"])
        failed = {r["id"]: r["error"] for r in out if r["status"] == "error"}
        assert set(failed) == {"r7", "r150"}
        assert "POISON" in failed["r7"]
        assert sum(r["status"] == "ok" for r in out) == 198
    finally:
        w.stop()


def test_prompt_template_error_is_a_row_not_a_failed_shard(tmp_path: Path, worker: WorkerProcess) -> None:
    layout, shards = make_run(tmp_path, 20)
    spec = infer_spec(layout, shards[0], prompt_template="{{ missing_field }}")
    status = worker.wait(worker.submit(spec).job_id)
    assert status.state == "succeeded"
    out = rows(spec.outputs["inferred"])
    assert all(r["status"] == "error" and "missing_field" in r["error"] for r in out)


def test_openai_batch_file_in_and_out(tmp_path: Path, worker: WorkerProcess) -> None:
    src = tmp_path / "batch.jsonl"
    src.write_text(
        "".join(
            json.dumps(
                {
                    "custom_id": f"req-{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {
                        "model": "m",
                        "messages": [{"role": "user", "content": f"{i}+1?"}],
                        "max_tokens": 8,
                    },
                }
            )
            + "\n"
            for i in range(30)
        )
    )
    layout = RunLayout(str(tmp_path / "run"))
    shards = shard_dataset(str(src), layout.input).shards
    spec = infer_spec(layout, shards[0], output_format="openai", id_field="custom_id")
    spec.params.pop("prompt_template")
    assert worker.wait(worker.submit(spec).job_id).state == "succeeded"
    out = rows(spec.outputs["inferred"])
    assert [o["custom_id"] for o in out] == [f"req-{i}" for i in range(30)]
    first = out[0]
    assert set(first) == {"id", "custom_id", "response", "error"} and first["error"] is None
    body = first["response"]["body"]
    assert first["response"]["status_code"] == 200 and body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant" and body["choices"][0]["message"]["content"]
    assert (
        body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
    )


def test_cancel_a_running_job(tmp_path: Path) -> None:
    w = start_worker(tmp_path, engine_args={"latency_base_s": 0.3})
    try:
        layout, shards = make_run(tmp_path, 100)
        spec = infer_spec(layout, shards[0], chunk_size=5)
        w.submit(spec)
        r = w.http("DELETE", f"/v1/jobs/{spec.job_id}")
        assert r.status_code == 200
        assert w.wait(spec.job_id).state == "cancelled"
        assert not Path(spec.outputs["inferred"]).exists()
        assert read_job_manifest(spec.outputs["manifest"]) is None
        assert w.http("DELETE", "/v1/jobs/nope").status_code == 404
    finally:
        w.stop()


def test_sigterm_drains_running_jobs_then_exits_cleanly(tmp_path: Path) -> None:
    w = start_worker(tmp_path, engine_args={"latency_base_s": 0.1})
    layout, shards = make_run(tmp_path, 200, per_shard=100)
    spec = infer_spec(layout, shards[0], chunk_size=10)
    w.submit(spec)
    time.sleep(0.3)
    w.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while True:  # new work is refused while draining
        r = w.http("POST", "/v1/jobs", json=infer_spec(layout, shards[1]).model_dump())
        if r.status_code == 503 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert r.status_code == 503 and r.json()["error"] == "draining"
    assert w.http("GET", "/v1/ready", token=None).status_code == 503
    assert w.process.wait(timeout=60) == 0
    manifest = read_job_manifest(spec.outputs["manifest"])
    assert manifest is not None and manifest.counts.model_dump() == {
        "generated": {"ok": 100}
    }  # the running job finished
    assert read_job_manifest(layout.job_manifest(0, shards[1].shard_id, "infer")) is None


def test_metrics_are_valid_prometheus_text(tmp_path: Path, worker: WorkerProcess) -> None:
    layout, shards = make_run(tmp_path, 50)
    worker.wait(worker.submit(infer_spec(layout, shards[0])).job_id)
    r = worker.http("GET", "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    jobs = families["batchinfer_jobs_finished"]
    assert [(s.labels, s.value) for s in jobs.samples] == [({"kind": "infer", "state": "succeeded"}, 1.0)]
    assert families["batchinfer_batches"].samples[0].value >= 1
    assert 0 < families["batchinfer_engine_utilization"].samples[0].value <= 1
    assert {s.labels["outcome"]: s.value for s in families["batchinfer_records"].samples} == {"ok": 50.0}


def test_insecure_no_auth_only_on_loopback(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="only allowed on a loopback"):
        start_worker(tmp_path, extra=["--insecure-no-auth", "--host", "0.0.0.0"], timeout=20)
    w = start_worker(tmp_path, extra=["--insecure-no-auth"], env={"BATCHINFER_WORKER_TOKEN": ""})
    try:
        assert httpx.get(w.url + "/v1/stats").status_code == 200
    finally:
        w.stop()


def test_worker_refuses_to_start_without_token_or_prefixes(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="no RPC token"):
        start_worker(tmp_path, env={"BATCHINFER_WORKER_TOKEN": ""}, timeout=20)
    with pytest.raises(RuntimeError, match="allow-prefix"):
        start_worker(tmp_path, allow=[], timeout=20)


def test_a_stubborn_sample_costs_one_window_place_not_the_worker(tmp_path: Path) -> None:
    repo = str(Path(__file__).resolve().parents[2])
    w = start_worker(
        tmp_path,
        concurrency=2,
        engine_args={"latency_base_s": 0.05},
        env={"PYTHONPATH": repo},
        extra=["--allow-callable", "tests.support.judges:"],  # callable judges: only those allowed
    )
    try:
        src = tmp_path / "data.jsonl"
        src.write_text("".join(json.dumps({"id": i, "q": str(i)}) + "\n" for i in [*range(29), "stubborn"]))
        layout = RunLayout(str(tmp_path / "run"))
        shard = shard_dataset(str(src), layout.input).shards[0]
        sid = shard.shard_id
        spec = JobSpec(
            job_id="stubborn",
            kind="in_place",
            input=shard.uri,
            outputs={
                "approved": layout.result(0, sid, tail=True),
                "rejected": layout.rejected(0, sid),
                "checkpoints": layout.checkpoints(0, sid),
                "manifest": layout.job_manifest(0, sid, "in_place"),
            },
            params={
                "prompt_template": "{{ q }}",
                "max_attempts": 60,
                "chunk_size": 30,
                "input_records": 30,
                "judge": {"type": "callable", "target": "tests.support.judges:approve_unless_stubborn"},
            },
        )
        w.submit(spec)
        deadline = time.monotonic() + 60
        while (status := w.status("stubborn")).progress.done < 29:  # everyone else is done...
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert status.state == "running"  # ...while the stubborn one keeps retrying
        other_layout, others = make_run(tmp_path / "other", 100)
        other = w.wait(w.submit(infer_spec(other_layout, others[0])).job_id)
        assert other.state == "succeeded"  # the worker still serves other jobs meanwhile
        assert w.status("stubborn").state == "running"
        final = w.wait("stubborn")
        assert (
            final.state == "succeeded"
            and final.counts.outcomes.approved == 29
            and final.counts.outcomes.max_attempts == 1
        )
        (row,) = rows(layout.rejected(0, sid))
        assert row["id"] == "stubborn" and row["attempts"] == 60
    finally:
        w.stop()


def test_a_long_poll_answers_when_the_job_ends_and_never_ends_the_job(tmp_path: Path) -> None:
    """``GET /v1/jobs/{id}?wait_s=``: one request sees the job's end (no poll interval between the end
    and the follower knowing it); a shorter wait answers ``running``, and a follower that goes away
    mid-wait leaves the job running."""
    w = start_worker(tmp_path, engine_args={"latency_base_s": 0.3})
    try:
        layout, shards = make_run(tmp_path, 40)
        spec = infer_spec(layout, shards[0], chunk_size=5)  # 8 chunks of 0.3 s batches
        w.submit(spec)
        assert w.http("GET", f"/v1/jobs/{spec.job_id}", params={"wait_s": 0.2}).json()["state"] == "running"
        with pytest.raises(httpx.ReadTimeout):  # the follower gives up mid-wait...
            w.http("GET", f"/v1/jobs/{spec.job_id}", params={"wait_s": 20}, timeout=0.3)
        done = w.http("GET", f"/v1/jobs/{spec.job_id}", params={"wait_s": 25}, timeout=30).json()
        assert (
            done["state"] == "succeeded" and done["counts"]["generated"]["ok"] == 40
        )  # ...the job ran to its end
        assert w.http("GET", "/v1/jobs/nope", params={"wait_s": 1}).status_code == 404
    finally:
        w.stop()


def test_the_worker_socket_sends_answers_at_once() -> None:
    """Every connection the worker accepts has TCP_NODELAY (inherited from its socket): without it,
    a kept-alive client (a pool's polls) waited ~40 ms per answer for its own delayed ACK."""
    server = bound_socket("127.0.0.1", 0)
    server.listen()
    client = socket.create_connection(server.getsockname()[:2])
    accepted, _ = server.accept()
    try:
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        for s in (accepted, client, server):
            s.close()
