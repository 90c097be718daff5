from __future__ import annotations

import asyncio
from typing import Any

import pytest

from airflow_batchinfer.batching import DynamicBatcher, Prompt, TokenBatcher


def test_prompt_estimate_tokens() -> None:
    assert Prompt("").estimate_tokens() == 1
    assert Prompt("abcd").estimate_tokens() == 2
    assert Prompt("x" * 399).estimate_tokens() == 100


class Both:
    def estimate_tokens(self) -> int:
        return 11

    def estimate_cost(self) -> int:
        return 99


class CostOnly:
    def estimate_cost(self) -> int:
        return 99


async def echo(batch: list[Any]) -> list[Any]:
    return batch


def test_token_cost_precedence() -> None:
    tb = TokenBatcher(
        echo, token_estimator=lambda r: 5 if isinstance(r, str) else None, default_token_estimate=3
    )
    plain = TokenBatcher(echo, default_token_estimate=3)
    assert tb._cost("s", 0) == 0  # explicit wins, 0 honoured
    assert tb._cost("s", None) == 5  # estimator
    assert plain._cost(Both(), None) == 11  # estimate_tokens() before estimate_cost()
    assert plain._cost(CostOnly(), None) == 99
    assert plain._cost(object(), None) == 3  # default_token_estimate


async def test_estimated_tokens_wins_over_estimated_cost() -> None:
    batches: list[list[Any]] = []

    async def fn(batch: list[Any]) -> list[Any]:
        batches.append(batch)
        return batch

    async with TokenBatcher(fn, target_batch_tokens=100, batch_timeout_s=5) as b:
        f1 = await b.submit("a", estimated_tokens=60, estimated_cost=1)
        f2 = await b.submit("b", estimated_tokens=60, estimated_cost=1)  # 120 >= 100: closes now
        await asyncio.wait_for(asyncio.gather(f1, f2), 1)
    assert batches == [["a", "b"]]


async def test_batches_by_prompt_tokens() -> None:
    batches: list[list[Prompt]] = []

    async def infer(batch: list[Prompt]) -> list[str]:
        batches.append(batch)
        return [p.text.upper() for p in batch]

    async with TokenBatcher(inference_fn=infer, target_batch_tokens=50, batch_timeout_s=1) as b:
        futs = [await b.submit(Prompt("word " * 20)) for _ in range(4)]  # 26 tokens each
        assert await asyncio.wait_for(asyncio.gather(*futs), 1) == ["WORD " * 20] * 4
    assert [len(x) for x in batches] == [2, 2]
    assert b.target_batch_tokens == 50


async def test_process_fn_alias_and_exactly_one_function() -> None:
    batches: list[list[str]] = []

    async def shout(batch: list[str]) -> list[str]:
        batches.append(batch)
        return [x.upper() for x in batch]

    b = TokenBatcher(process_fn=shout, target_batch_tokens=2, default_token_estimate=1, batch_timeout_s=5)
    assert isinstance(b, DynamicBatcher)
    async with b:
        futs = [await b.submit(x) for x in ("a", "b", "c", "d")]
        assert await asyncio.wait_for(asyncio.gather(*futs), 1) == ["A", "B", "C", "D"]
    assert batches == [["a", "b"], ["c", "d"]]  # the alias is the batch function, batched by tokens
    with pytest.raises(ValueError, match="exactly one"):
        TokenBatcher()
    with pytest.raises(ValueError, match="exactly one"):
        TokenBatcher(echo, process_fn=echo)


def test_token_batcher_validates_like_dynamic() -> None:
    with pytest.raises(ValueError, match="target_batch_cost"):
        TokenBatcher(echo, target_batch_tokens=0)
