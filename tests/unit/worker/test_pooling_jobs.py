"""Pooling tasks' jobs in-process (SIMULATED engine, no sockets): an embed job's rows (vectors stored
compactly, a list input's vectors in order, an error a row of its own, every id once), its OpenAI batch
lines in ``vllm run-batch``'s shape, and a classify job as a filter (the label judge keeps some labels)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_batchinfer.engines import create_engine
from airflow_batchinfer.engines.pooling import decode_vector, shaped, simulated_vector
from airflow_batchinfer.engines.scoring import ScoreResult, ScoringModel
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.state.docs import read_job_manifest
from airflow_batchinfer.state.params import parse_params
from airflow_batchinfer.storage import JsonlFile
from airflow_batchinfer.worker.jobs.pooling import Pooling, Text
from airflow_batchinfer.worker.registry import JobRegistry
from airflow_batchinfer.worker.runtime import Runtime


def run_job(
    tmp_path: Path, records: list[dict[str, Any]], kind: str, params: dict[str, Any], **engine: Any
) -> dict:
    tmp_path.mkdir(parents=True, exist_ok=True)
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    names = ("inferred",) if kind == "infer" else ("approved", "rejected")
    outputs = {n: str(tmp_path / f"{n}.jsonl.zst") for n in names}
    outputs["manifest"] = str(tmp_path / "manifest.json")
    spec = JobSpec(
        job_id=f"{kind}-1", kind=kind, input=str(src), outputs=outputs, params={"chunk_size": 3, **params}
    )

    async def main() -> None:
        runtime = Runtime(create_engine("simulated", latency_base_s=0.0, **engine), batch_timeout_s=0.001)
        await runtime.start()
        try:
            registry = JobRegistry(runtime, concurrency=1)
            registry.submit(spec, parse_params(spec.kind, spec.params))
            task = registry.jobs[spec.job_id].task
            assert task is not None
            await task
        finally:
            await runtime.close()

    asyncio.run(main())
    manifest = read_job_manifest(outputs["manifest"])
    assert manifest is not None
    rows = {n: list(JsonlFile(outputs[n]).iter_records()) for n in names}
    return {"manifest": manifest, **rows}


def test_an_embed_job_writes_each_records_vector_compactly_and_every_id_once(tmp_path: Path) -> None:
    records = [{"id": f"r{i}", "q": f"text {i}"} for i in range(7)] + [{"id": "bad", "q": "BAD"}]
    out = run_job(
        tmp_path, records, "infer", {"task": "embed", "prompt_template": "say {{ q }}"},
        embedding_dimensions=16, fail_marker="BAD",
    )  # fmt: skip
    rows = {r["id"]: r for r in out["inferred"]}
    assert sorted(rows) == sorted(r["id"] for r in records)  # one row each
    row = rows["r3"]
    assert (row["task"], row["status"], row["result"], row["embedding_dtype"], row["dimensions"]) == (
        "embed", "ok", None, "float32", 16,
    )  # fmt: skip
    assert decode_vector(row["embedding"]) == pytest.approx(simulated_vector("say text 3", 16), rel=1e-6)
    assert (
        rows["bad"]["status"] == "error" and "BAD" in rows["bad"]["error"] and "embedding" not in rows["bad"]
    )
    counts = out["manifest"].counts
    assert (counts.generated.ok, counts.generated.error) == (7, 1)
    assert out["manifest"].ids["inferred"].count == 8


def test_openai_embeddings_requests_give_vllm_run_batchs_lines(tmp_path: Path) -> None:
    records = [
        {"custom_id": "a", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "m", "input": "hello", "dimensions": 4}},
        {"custom_id": "b", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "m", "input": ["x", "y"], "encoding_format": "base64"}},
        {"custom_id": "c", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "m", "input": "x", "n": 2}},
    ]  # fmt: skip
    out = run_job(
        tmp_path, records, "infer", {"task": "embed", "output_format": "openai", "id_field": "custom_id"},
        embedding_dimensions=8,
    )  # fmt: skip
    lines = {line["custom_id"]: line for line in out["inferred"]}
    body = lines["a"]["response"]["body"]
    assert lines["a"]["error"] is None and lines["a"]["response"]["status_code"] == 200
    assert (body["object"], body["model"], set(body)) == (
        "list",
        "m",
        {"id", "object", "created", "model", "data", "usage"},
    )
    assert body["id"].startswith("embd-")
    (item,) = body["data"]
    assert (item["object"], item["index"]) == ("embedding", 0)
    assert item["embedding"] == pytest.approx(list(shaped(simulated_vector("hello", 8), 4)))
    assert body["usage"] == {
        "prompt_tokens": 2,
        "total_tokens": 2,
        "completion_tokens": 0,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    many = lines["b"]["response"]["body"]["data"]
    assert [d["index"] for d in many] == [0, 1]
    assert decode_vector(many[1]["embedding"]) == pytest.approx(simulated_vector("y", 8), rel=1e-6)  # base64
    assert lines["c"]["response"] is None
    assert lines["c"]["error"]["message"].startswith("body: n: not read by task embed")


def test_a_classify_job_filters_by_the_labels_it_keeps(tmp_path: Path) -> None:
    records = [{"id": f"r{i}", "q": f"text {i}"} for i in range(12)]
    params = {
        "task": "classify",
        "prompt_template": "{{ q }}",
        "judge": {"type": "label", "keep_labels": ["pos"]},
    }
    out = run_job(tmp_path, records, "infer_judge", params, labels=["neg", "pos"])
    approved, rejected = out["approved"], out["rejected"]
    assert sorted(r["id"] for r in approved + rejected) == sorted(r["id"] for r in records)
    assert approved and rejected  # hashed logits: some of each
    for row in approved + rejected:
        assert row["label"] == row["result"] == max(row["probs"], key=row["probs"].get)
        assert sum(row["probs"].values()) == pytest.approx(1.0)
        assert row["judgment"]["score"] == pytest.approx(row["probs"]["pos"])
    assert all(r["label"] == "pos" for r in approved) and all(r["label"] == "neg" for r in rejected)
    assert out["manifest"].counts.outcomes.approved == len(approved)


def test_a_score_job_keeps_every_row_with_the_accept_judge(tmp_path: Path) -> None:
    records = [{"id": f"r{i}", "q": f"text {i}"} for i in range(4)]
    params = {"task": "score", "prompt_template": "{{ q }}", "judge": {"type": "accept"}}
    out = run_job(tmp_path, records, "infer_judge", params, labels=["reward"])
    assert len(out["approved"]) == 4 and not out["rejected"]
    assert all(isinstance(r["score"], float) and r["result"] is None for r in out["approved"])
    two = run_job(tmp_path / "two", records, "infer_judge", params, labels=["a", "b"])
    assert all(set(r["scores"]) == {"a", "b"} for r in two["approved"])


def test_a_worker_refuses_an_embed_job_its_model_cannot_run(tmp_path: Path) -> None:
    from airflow_batchinfer.worker.app import serving_refusal

    params = parse_params("infer", {"task": "embed", "prompt_template": "{{ q }}"})
    why = serving_refusal("infer", params, create_engine("simulated"))
    assert why is not None and "task embed needs an embedding model" in why
    generate = parse_params("infer", {"prompt_template": "{{ q }}"})
    why = serving_refusal("infer", generate, create_engine("simulated", embedding_dimensions=4))
    assert why is not None and "is an embedding model" in why


def test_outputs_that_do_not_fit_the_labels_error_that_record_not_the_chunk() -> None:
    scoring = ScoringModel("/m/sentiment", ("NEGATIVE", "POSITIVE"))
    pooling = Pooling.__new__(Pooling)
    pooling.task = "classify"
    pooling.ctx = SimpleNamespace(  # type: ignore[assignment]
        params=SimpleNamespace(output_format="rows", round=0),
        runtime=SimpleNamespace(engine=SimpleNamespace(scoring=scoring)),
    )
    outs = [ScoreResult(logits=(0.1, 2.0)), ScoreResult(logits=(0.1, 2.0, 3.0))]
    rows, counts = pooling.rows([{"id": "a"}, {"id": "b"}], [Text(("x",)), Text(("y",))], outs)
    assert rows[0]["label"] == "POSITIVE" and rows[0]["status"] == "ok"
    assert rows[1]["status"] == "error" and "3 outputs for the model's 2 labels" in rows[1]["error"]
    assert (counts.ok, counts.error) == (1, 1)


def test_image_parts_are_refused_by_a_pooling_task_naming_the_record(tmp_path: Path) -> None:
    """A pooling task reads text: an image part is that record's error, never silently dropped."""
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    text = {"type": "text", "text": "a"}
    records = [
        {"custom_id": "pic", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "m", "messages": [{"role": "user", "content": [text, image]}]}},
        {"custom_id": "txt", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "m", "messages": [{"role": "user", "content": [text]}]}},
    ]  # fmt: skip
    out = run_job(
        tmp_path, records, "infer", {"task": "embed", "output_format": "openai", "id_field": "custom_id"},
        embedding_dimensions=8,
    )  # fmt: skip
    lines = {line["custom_id"]: line for line in out["inferred"]}
    error = lines["pic"]["error"]["message"]
    assert lines["pic"]["response"] is None
    assert "record pic: messages[0].content[1] is an image part, and task embed pools text only" in error
    assert "a generate task to a pool serving a vision-language model" in error
    assert lines["txt"]["error"] is None  # text parts are read (as their text)
    item = lines["txt"]["response"]["body"]["data"][0]
    assert item["embedding"] == pytest.approx(list(simulated_vector("a", 8)))
