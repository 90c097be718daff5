"""Token budgets with a reasoning model's thinking in them.

Every engine counts the thinking **inside** ``max_tokens``: vLLM's ``thinking_token_budget`` ends the
reasoning after that many tokens (it forces the end-of-thinking token) while ``max_tokens`` still
bounds every generated token, reasoning and answer together (``vllm/sampling_params.py``: "Maximum
number of tokens allowed for thinking operations"; the output's length is checked against
``max_tokens`` whatever part of it is reasoning); OpenAI's ``max_completion_tokens`` covers the
reasoning tokens, and transformers' ``max_new_tokens`` every new token. So:

- a request occupies at most ``n × max_tokens`` completion tokens whatever its thinking budget:
  :meth:`~airflow_batchinfer.engines.base.GenerationRequest.estimate_tokens`, what the batcher sizes
  batches by, needs no term for the thinking (adding the budget would count it twice);
- what the budget changes is the answer's room: ``max_tokens - thinking_token_budget``
  (:func:`answer_room`). A budget at or above ``max_tokens`` never ends the thinking before
  ``max_tokens`` does, and a model that thinks that long is cut before it answers
  (``truncated_in_thinking``): the pre-flight warns of it (:func:`thinking_warnings`);
- and what a record costs on average: a reasoning model spends most of its budget thinking on each
  record, so ``batchinfer plan`` adds ``--thinking-tokens`` to ``--tokens-per-record``
  (:func:`record_tokens`); the pre-flight measures the thinking with the rest of the completion.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["THINKING_BUDGET", "answer_room", "record_tokens", "thinking_warnings"]

THINKING_BUDGET = "thinking_token_budget"  # vLLM's name, the request field's


def answer_room(max_tokens: int, thinking_token_budget: int | None) -> int | None:
    """The tokens left for the answer after a whole thinking budget (``None``: no budget, the
    thinking is bounded by ``max_tokens`` only); 0 when the budget leaves none."""
    if thinking_token_budget is None:
        return None
    return max(0, max_tokens - thinking_token_budget)


def record_tokens(tokens_per_record: float, thinking_tokens: float) -> float:
    """What a record costs a pass: its prompt and answer (``tokens_per_record``) and the tokens a
    reasoning model thinks on it (about its thinking budget; 0: not a reasoning model)."""
    return tokens_per_record + thinking_tokens


def thinking_warnings(sampling: Mapping[str, Any], max_tokens: int, where: str = "sampling") -> list[str]:
    """A warning when the sampling fields ``sampling`` (running with ``max_tokens``) give the
    thinking a budget that leaves the answer no room; ``[]`` otherwise."""
    budget = sampling.get(THINKING_BUDGET)
    if not isinstance(budget, int) or isinstance(budget, bool) or answer_room(max_tokens, budget):
        return []
    return [
        f"{where}.{THINKING_BUDGET} {budget} leaves no room for the answer within max_tokens {max_tokens}: "
        "the thinking counts inside max_tokens, so a model that thinks to its budget is cut before it "
        "answers (truncated_in_thinking). Remedy: max_tokens above the thinking budget plus the answer's "
        "length, or a lower thinking_token_budget"
    ]
