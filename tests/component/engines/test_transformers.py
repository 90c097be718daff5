"""The transformers engine on a real (tiny, random) Llama: batching, padding, chat template, limits."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_batchinfer.engines import Engine, GenerationRequest, SamplingParams, create_engine

pytest.importorskip("torch", reason="needs the transformers extra")


@pytest.fixture(scope="module")
def engine(tiny_model: str) -> Iterator[Engine]:
    """Loaded once per module (the engine holds no event-loop state: it generates in a thread)."""
    e = create_engine("transformers", model=tiny_model)
    asyncio.run(e.start())
    yield e
    asyncio.run(e.close())


def chat(text: str, **sampling: object) -> GenerationRequest:
    return GenerationRequest(
        text, messages=[{"role": "user", "content": text}], sampling=SamplingParams(**sampling)
    )  # type: ignore[arg-type]


async def test_batched_equals_one_by_one_with_left_padding(engine: Engine) -> None:
    reqs = [
        chat("one", max_tokens=8),
        chat("the quick brown fox jumps over the lazy dog twice", max_tokens=8),
        chat("what is 2+2?", max_tokens=8),
    ]
    batched = await engine.generate(reqs)
    single = [(await engine.generate([r]))[0] for r in reqs]
    assert [b.text for b in batched] == [s.text for s in single]
    assert all(b.ok and b.completion_tokens <= 8 for b in batched)
    assert batched[1].prompt_tokens > batched[0].prompt_tokens  # real token counts, padding excluded


async def test_mixed_sampling_in_one_batch_and_seeded_sampling(engine: Engine) -> None:
    greedy, short = chat("hello", max_tokens=6), chat("hello", max_tokens=2)
    seeded = chat("hello", max_tokens=6, temperature=1.0, seed=1)
    out = await engine.generate([greedy, short, seeded, seeded])
    again = await engine.generate([greedy, short, seeded, seeded])
    assert out[1].completion_tokens <= 2
    assert [o.text for o in out] == [a.text for a in again]  # a seeded batch samples reproducibly


async def test_prompt_too_long_fails_only_that_element(engine: Engine) -> None:
    out = await engine.generate([chat("fine", max_tokens=4), chat("word " * 600, max_tokens=4)])
    assert out[0].ok
    assert not out[1].ok and "exceeds the model's context of 512" in (out[1].error or "")


async def test_raw_prompt_and_stop_strings(engine: Engine) -> None:
    def raw(**sampling: Any) -> GenerationRequest:
        return GenerationRequest(
            "r", prompt="the answer is", sampling=SamplingParams(max_tokens=16, **sampling)
        )

    (out,) = await engine.generate([raw()])  # greedy, on a model built from a fixed seed: same text each time
    assert out.ok and out.prompt_tokens > 0
    text = out.text or ""
    # cut inside the text, not at its start: the first position holding a character other than text[0]
    at = next((i for i, ch in enumerate(text) if ch != text[0]), len(text))
    assert at + 2 <= len(text), f"precondition: greedy output {text!r} is too short to cut"
    stop = text[at : at + 2]  # a two-character stop string; it cannot occur before ``at``
    (cut,) = await engine.generate([raw(stop=(stop,))])
    assert cut.ok and cut.finish_reason == "stop"
    assert cut.text == text[:at] and stop not in cut.text


@pytest.mark.slow
async def test_smollm2_writes_real_text(smollm2: str) -> None:
    e = create_engine("transformers", model=smollm2)
    await e.start()
    try:
        (out,) = await e.generate(
            [chat("What is the capital of France? Answer in one sentence.", max_tokens=24)]
        )
    finally:
        await e.close()
    assert out.ok and out.finish_reason == "stop"
    assert "Paris" in (out.text or "")
