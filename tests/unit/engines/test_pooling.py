"""Pooling tasks' shared pieces (engines.pooling): vectors shaped and stored compactly, a classifier's
labels, the simulated engine's vectors, what a worker refuses, and the task on the wire (a generate
job's id unchanged)."""

from __future__ import annotations

import asyncio
import math
import re

import pytest

from airflow_batchinfer.engines import create_engine
from airflow_batchinfer.engines.pooling import (
    EmbeddingModel,
    EmbedRequest,
    classify,
    decode_vector,
    dimensions_refusal,
    encode_vector,
    served_refusal,
    shaped,
    simulated_vector,
    task_refusal,
)
from airflow_batchinfer.engines.scoring import ScoreRequest, ScoringModel
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.rpc.fingerprint import spec_key
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.params import parse_params


def test_a_vector_is_cut_to_its_dimensions_then_normalized() -> None:
    assert shaped([3.0, 4.0, 12.0], None) == pytest.approx((3 / 13, 4 / 13, 12 / 13))
    assert shaped([3.0, 4.0, 12.0], 2) == pytest.approx((0.6, 0.8))
    assert shaped([0.0, 0.0], None) == (0.0, 0.0)  # no division by zero
    assert shaped([3.0, 4.0], None, normalize=False) == (3.0, 4.0)


def test_a_vector_is_stored_as_base64_float32_and_read_back() -> None:
    vector = [0.5, -0.25, 1e-3, 0.0]
    text = encode_vector(vector)
    assert len(text) == math.ceil(4 * len(vector) / 3) * 4  # 4 bytes a value, base64
    assert decode_vector(text) == pytest.approx(vector, rel=1e-6)


def test_classify_is_a_softmax_with_the_likeliest_label_or_a_sigmoid() -> None:
    model = ScoringModel("/m", ("neg", "pos"))
    label, probs = classify([0.0, math.log(3)], model)
    assert label == "pos" and probs == pytest.approx({"neg": 0.25, "pos": 0.75})
    label, probs = classify([0.0], ScoringModel("/m", ("good",)))
    assert label == "good" and probs == pytest.approx({"good": 0.5})
    with pytest.raises(ValueError, match="3 outputs"):
        classify([0.0, 1.0, 2.0], model)


def test_simulated_vectors_are_deterministic_and_differ_by_text() -> None:
    a, b = simulated_vector("a", 16), simulated_vector("b", 16)
    assert a == simulated_vector("a", 16) and a != b and len(a) == 16
    assert sum(v * v for v in a) == pytest.approx(1.0)


def test_the_simulated_engine_embeds_and_refuses_more_dimensions_than_its_own() -> None:
    async def main() -> list:
        engine = create_engine("simulated", embedding_dimensions=8, latency_base_s=0.0, fail_marker="BAD")
        try:
            return await engine.embed(
                [EmbedRequest("1", prompt="x"), EmbedRequest("2", prompt="x", dimensions=4),
                 EmbedRequest("3", prompt="x", dimensions=9), EmbedRequest("4", prompt="BAD")]
            )  # fmt: skip
        finally:
            await engine.close()

    full, short, too_many, bad = asyncio.run(main())
    assert full.vector == simulated_vector("x", 8) and full.prompt_tokens == 1
    assert short.vector == pytest.approx(shaped(simulated_vector("x", 8), 4))
    assert too_many.error is not None and "dimensions 9 is more than the model's 8" in too_many.error
    assert bad.error is not None and "BAD" in bad.error


def test_dimensions_only_for_a_matryoshka_model() -> None:
    plain, nested = EmbeddingModel("/m/e5", 8), EmbeddingModel("/m/e5", 8, matryoshka=True)
    why = dimensions_refusal(EmbedRequest("1", prompt="x", dimensions=4), plain)
    assert why is not None and "e5 is no Matryoshka model" in why
    assert dimensions_refusal(EmbedRequest("1", prompt="x", dimensions=4), nested) is None
    assert dimensions_refusal(EmbedRequest("1", prompt="x"), plain) is None


def test_an_engine_without_an_embedding_model_fails_each_request_saying_so() -> None:
    async def main() -> list:
        engine = create_engine("simulated")
        try:
            return await engine.embed([EmbedRequest("1", prompt="x")])
        finally:
            await engine.close()

    (result,) = asyncio.run(main())
    assert result.error is not None and "serves no embedding model" in result.error


def test_the_simulated_engine_with_labels_scores_deterministically() -> None:
    async def main() -> list:
        engine = create_engine("simulated", labels=["neg", "pos"])
        try:
            return [await engine.score([ScoreRequest("1", prompt=t)]) for t in ("a", "a", "b")]
        finally:
            await engine.close()

    (a,), (again,), (b,) = asyncio.run(main())
    assert a.logits == again.logits and a.logits != b.logits and a.logits is not None and len(a.logits) == 2


@pytest.mark.parametrize(
    ("task", "scoring", "embedding", "match"),
    [
        ("embed", None, None, "task embed needs an embedding model"),
        ("classify", None, EmbeddingModel("/e", 8), "task classify needs a sequence-classification"),
        ("score", None, None, "task score needs"),
        ("generate", None, EmbeddingModel("/models/e5", 8), r"\(e5\) is an embedding model"),
    ],
)
def test_a_worker_refuses_a_task_its_model_cannot_run(
    task: str, scoring: ScoringModel | None, embedding: EmbeddingModel | None, match: str
) -> None:
    why = task_refusal(task, scoring, embedding)
    assert why is not None
    assert re.search(match, why)


def test_a_worker_runs_a_task_its_model_serves() -> None:
    assert task_refusal("embed", None, EmbeddingModel("/e", 8)) is None
    assert task_refusal("classify", ScoringModel("/c", ("a", "b")), None) is None
    assert task_refusal("generate", None, None) is None


RUN = {"input": "/d.jsonl", "run_root": "/r", "prompt_template": "{{ q }}"}


def test_the_task_travels_only_when_not_generate_so_generate_job_ids_stay() -> None:
    generate = RunConfig.of(**RUN, judge={"type": "llm"})
    embed = RunConfig.of(**RUN, judge={"type": "accept"}, task="embed")
    assert "task" not in generate.infer_params().wire()
    assert embed.infer_params().wire()["task"] == "embed"

    def key(params: dict) -> str:
        return spec_key(JobSpec(job_id="j", kind="infer", input="/i", outputs={"m": "/o"}, params=params))

    assert key(generate.infer_params().wire()) == key(
        {k: v for k, v in embed.infer_params().wire().items() if k != "task"}
    )
    assert key(generate.infer_params().wire()) != key(embed.infer_params().wire())
    assert parse_params("infer", embed.infer_params().wire()).task == "embed"
    assert parse_params("infer", generate.infer_params().wire()).task == "generate"


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"task": "embed", "judge": {"type": "llm"}}, 'set judge {"type": "accept"}'),
        ({"task": "score", "judge": {"type": "label", "keep_labels": ["a"]}}, "no text"),
        ({"task": "classify", "judge": {"type": "llm"}}, "cannot answer the 'llm' judge"),
        ({"task": "classify", "judge": {"type": "accept"}, "strategy": "hybrid"}, "use strategy rounds"),
        ({"task": "rank", "judge": {"type": "accept"}}, "task must be one of generate, embed"),
    ],
)
def test_a_pooling_run_refuses_what_it_cannot_do(settings: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(match)):
        RunConfig.of(**{**RUN, **settings}).validate()


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"task": "embed", "sampling": {"temperature": 1.0}}, "params.sampling: task embed reads"),
        ({"task": "classify", "system": "be brief"}, "params.system"),
        ({"task": "nope"}, "params.task must be one of"),
    ],
)
def test_a_pooling_job_refuses_what_would_be_dropped(params: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_params("infer", {"prompt_template": "{{ q }}", **params})
    with pytest.raises(ConfigError, match="in_place"):
        parse_params("in_place", {"prompt_template": "{{ q }}", "task": "embed", "judge": {"type": "accept"}})


@pytest.mark.parametrize(
    ("task", "described", "match"),
    [
        (
            "generate",
            {"model": "cls", "task": "score"},
            r"serves a scoring model \(cls\), which generates nothing",
        ),
        ("generate", {"model": "e5", "task": "embed"}, r"serves an embedding model \(e5\)"),
        ("embed", {"model": "llama"}, r"task embed needs an embedding model on the run's pool"),
        ("classify", {"model": "e5", "task": "embed"}, r"task classify needs a sequence-classification"),
    ],
)
def test_the_runs_pool_must_serve_the_runs_task(task: str, described: dict, match: str) -> None:
    why = served_refusal(task, described)
    assert why is not None and re.search(match, why)


def test_the_runs_pool_serves_the_runs_task() -> None:
    assert served_refusal("generate", {"model": "llama"}) is None
    assert served_refusal("embed", {"task": "embed"}) is None
    assert served_refusal("score", {"task": "score"}) is None
