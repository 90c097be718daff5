"""Scoring models: the transformers engine on a real (tiny, random) sequence classifier, the worker's
shared batcher feeding it, and what the raw outputs mean (probabilities, default labels)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_batchinfer.engines import Engine, GenerationRequest, create_engine
from airflow_batchinfer.engines.scoring import (
    ScoreRequest,
    ScoringModel,
    default_label,
    is_scoring_architecture,
    label_probability,
)
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.worker.runtime import Runtime


def test_label_probability_is_a_softmax_or_a_sigmoid() -> None:
    logits = [-1.0, 2.0, 0.5]
    total = sum(math.exp(v) for v in logits)
    assert label_probability(logits, 1) == pytest.approx(math.exp(2.0) / total)
    assert sum(label_probability(logits, i) for i in range(3)) == pytest.approx(1.0)
    # one output (a reward head read as a probability) and multi-label models: the label's own sigmoid
    assert label_probability([0.0], 0) == pytest.approx(0.5)
    assert label_probability([-800.0], 0) == pytest.approx(0.0)  # no overflow either way
    assert label_probability([800.0], 0) == pytest.approx(1.0)
    assert label_probability([2.0, 2.0], 1, multi_label=True) == pytest.approx(1 / (1 + math.exp(-2)))
    assert label_probability([1000.0, 0.0], 0) == pytest.approx(1.0)  # stable softmax


@pytest.mark.parametrize(
    ("labels", "chosen"),
    [
        (("LABEL_0", "LABEL_1"), 1),
        (("POSITIVE", "NEGATIVE"), 0),
        (("toxic", "safe", "unsure"), 1),
        (("rejected", "approved"), 1),
        (("score",), 0),
        (("a", "b", "c"), 2),
    ],
)
def test_default_label(labels: tuple[str, ...], chosen: int) -> None:
    assert default_label(labels) == chosen


def test_a_label_by_name_or_index_or_refused_naming_the_labels() -> None:
    model = ScoringModel("/m", ("rejected", "approved"))
    assert model.label_index(None) == 1
    assert model.label_index("rejected") == 0 and model.label_index("APPROVED") == 1
    assert model.label_index(0) == 0
    for bad in ("maybe", 2, -1):
        with pytest.raises(ConfigError, match=r"not one of this model's labels \['rejected', 'approved'\]"):
            model.label_index(bad)


def test_scoring_architectures() -> None:
    assert is_scoring_architecture(["LlamaForSequenceClassification"])
    assert not is_scoring_architecture(["LlamaForCausalLM"]) and not is_scoring_architecture(None)


@pytest.fixture(scope="module")
def scorer(tiny_classifier: str) -> Iterator[Engine]:
    pytest.importorskip("torch", reason="needs the transformers extra")
    e = create_engine("transformers", model=tiny_classifier)
    asyncio.run(e.start())
    yield e
    asyncio.run(e.close())


def direct_logits(model_dir: str, texts: list[str]) -> list[list[float]]:
    """The classifier run directly, one text at a time (the reference the engine must match)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    out = []
    with torch.inference_mode():
        for text in texts:
            enc = tok(text, return_tensors="pt", add_special_tokens=False)
            out.append(model(**enc).logits[0].tolist())
    return out


def conversation(question: str, answer: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]


async def test_a_batch_scores_as_each_text_alone_through_the_chat_template(
    scorer: Engine, tiny_classifier: str
) -> None:
    assert scorer.scoring is not None and scorer.scoring.labels == ("rejected", "approved")
    assert scorer.describe()["labels"] == ["rejected", "approved"] and scorer.describe()["task"] == "score"
    pairs = [("what is two plus two?", "four"), ("hi", "the quick brown fox jumps over the lazy"), ("", "0")]
    requests = [ScoreRequest(str(i), messages=conversation(*p)) for i, p in enumerate(pairs)]
    results = await scorer.score(requests)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_classifier)
    texts = [tok.apply_chat_template(conversation(*p), tokenize=False) for p in pairs]
    expected = direct_logits(tiny_classifier, texts)
    assert all(r.ok and r.logits is not None and len(r.logits) == 2 for r in results)
    for r, want in zip(results, expected, strict=True):
        assert r.logits == pytest.approx(want, abs=1e-4)  # right padding: each as it scores alone
    assert len({r.logits for r in results}) == 3  # different texts, different scores
    assert results[0].prompt_tokens == len(tok(texts[0], add_special_tokens=False)["input_ids"])


async def test_scoring_is_total_and_generation_refused(scorer: Engine) -> None:
    too_long = ScoreRequest("long", prompt="four " * 2000)
    fine = ScoreRequest("fine", prompt="the answer is four")
    results = await scorer.score([too_long, fine])
    assert results[0].error is not None and "more than the model's context of 512" in results[0].error
    assert results[1].ok and results[1].logits is not None  # the batch goes on without the long text
    generated = await scorer.generate([GenerationRequest("g", prompt="hi")])
    assert generated[0].error is not None and "is a scoring model: it generates nothing" in generated[0].error


async def test_a_generating_engine_scores_nothing(tiny_model: str) -> None:
    engine = create_engine("simulated")
    (result,) = await engine.score([ScoreRequest("x", prompt="hi")])
    assert engine.scoring is None
    assert result.error is not None and "serves no scoring model" in result.error


async def test_score_requests_share_the_workers_batcher(scorer: Engine) -> None:
    runtime = Runtime(scorer, target_batch_tokens=10_000, batch_timeout_s=0.05)
    await runtime.batcher.start()  # the engine is loaded already
    try:
        requests = [ScoreRequest(str(i), prompt=f"answer number {i}") for i in range(12)]
        results = await asyncio.gather(runtime.score(requests[:6]), runtime.score(requests[6:]))
        stats = runtime.batcher.stats
        assert [r.ok for part in results for r in part] == [True] * 12
        assert stats.total_submitted == 12 and stats.total_batches < 12  # two jobs' requests batched
        alone = await scorer.score(requests[:1])
        assert results[0][0].logits == pytest.approx(alone[0].logits, abs=1e-4)
    finally:
        await runtime.batcher.stop()
