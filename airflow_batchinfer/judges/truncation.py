"""Truncation is a reason, not a result: a completion the engine cut at ``max_tokens``
(``finish_reason == "length"``) is half an answer, whatever a judge would make of it.

A row carries the ``finish_reason`` of its generation and the ``max_tokens`` it ran with. The
judge step rejects a truncated row before the judge sees it (``truncated: reject``, the default: the
judge's tokens are not spent on half an answer, and its verdict on one is noise), with a reason of
the group ``truncated``; ``truncated: judge`` lets the judge decide (a prefix may be what is wanted:
a regex on the first line, a summary capped on purpose). A rejected row is retried like any other
(the next round, or in place), and its retry may run with more tokens:
``truncated_max_tokens_factor`` times what the truncated attempt ran with, never above
``max_tokens_cap`` (a DAG run's is the deployment's ``max_max_tokens``). A sample's retries never run
with fewer tokens than its last attempt did, nor with more than the cap, whatever a row says it ran
with.

A reasoning model's row cut while it was still thinking (``truncated_in_thinking: true``: the engine
parsed reasoning that never ended) is its own reason, of the group ``truncated_in_thinking``: the model
spent its whole budget thinking and wrote no answer at all. Its retry raises ``max_tokens`` the same
way and, when the attempt ran with a ``thinking_token_budget`` (the row says which), that budget by the
same factor, never above the retry's ``max_tokens`` (vLLM counts the thinking inside ``max_tokens``).
It is counted among the truncated rows, and apart (``truncated_in_thinking``).

:func:`decide` is the one decision (a pure function of the finish reason, the attempt, the
``max_tokens`` it ran with and the policy); the judge step (its reason) and the next attempt's request
(``retries.sent_with``, told it by the worker's ``jobs.infer.least_budget``) both take it from
there: the larger of it and the attempt's ``retry_sampling`` entry.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_batchinfer.engines.budget import THINKING_BUDGET
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges.reasons import TRUNCATED, TRUNCATED_IN_THINKING

__all__ = [
    "DEFAULT_FACTOR",
    "LENGTH",
    "TRUNCATED",
    "TRUNCATED_IN_THINKING",
    "TRUNCATED_MODES",
    "Decision",
    "TruncationPolicy",
    "decide",
    "row_decision",
    "thinking_budget",
    "tightest_cap",
]

LENGTH = "length"  # the finish reason of a completion cut at max_tokens
TRUNCATED_MODES = ("reject", "judge")
DEFAULT_MODE = "reject"
DEFAULT_FACTOR = 2.0
MAX_FACTOR = 16.0  # more than enough in one step; a typo (200 for 2.0) is refused, not run
CAP_REMEDY = "shorten the answers the prompt asks for, or ask for a higher max_max_tokens"


@dataclass(frozen=True)
class TruncationPolicy:
    """What the judge step and retries do with truncated rows (the run settings ``truncated``,
    ``truncated_max_tokens_factor`` and ``max_tokens_cap``)."""

    mode: str = DEFAULT_MODE
    max_tokens_factor: float = DEFAULT_FACTOR
    max_tokens_cap: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in TRUNCATED_MODES:
            raise ConfigError(f"truncated {self.mode!r}: choose one of {', '.join(TRUNCATED_MODES)}")
        factor = self.max_tokens_factor
        if isinstance(factor, bool) or not isinstance(factor, int | float) or not 1 <= factor <= MAX_FACTOR:
            raise ConfigError(
                f"truncated_max_tokens_factor must be a number in [1, {MAX_FACTOR:g}] (1: never raised), "
                f"got {factor!r}"
            )
        cap = self.max_tokens_cap
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ConfigError(f"max_tokens_cap must be a whole number >= 1, or empty (no cap), got {cap!r}")

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> TruncationPolicy:
        """The policy of a job's ``params`` (absent keys: the defaults); a bad value is a
        :class:`ConfigError` naming the param."""
        try:
            return cls(
                mode=params.get("truncated", DEFAULT_MODE),
                max_tokens_factor=params.get("truncated_max_tokens_factor", DEFAULT_FACTOR),
                max_tokens_cap=params.get("max_tokens_cap"),
            )
        except ConfigError as exc:
            raise ConfigError(f"params.{exc}") from None


@dataclass(frozen=True)
class Decision:
    """What follows a finished attempt.

    :ivar truncated: its completion was cut at ``max_tokens``.
    :ivar reject: rejected before the judge (``truncated: reject``); ``reason`` says why.
    :ivar max_tokens: the least the next attempt runs with (``None``: the job's own).
    :ivar at_cap: ``max_tokens`` is the cap: it cannot be raised any further.
    :ivar reason: the rejection's reason (a truncated attempt only; its group is ``truncated``, or
        ``truncated_in_thinking``).
    :ivar in_thinking: the attempt was cut while still thinking.
    :ivar thinking_token_budget: the least thinking budget the next attempt runs with (``None``: its
        own; raised only after an attempt cut in thinking that ran with one).
    """

    truncated: bool
    reject: bool
    max_tokens: int | None
    at_cap: bool = False
    reason: str | None = None
    in_thinking: bool = False
    thinking_token_budget: int | None = None


def decide(
    finish_reason: str | None,
    attempt: int,
    max_tokens: int | None,
    policy: TruncationPolicy,
    *,
    in_thinking: bool = False,
    thinking_token_budget: int | None = None,
) -> Decision:
    """The decision after ``attempt`` ran with ``max_tokens`` and ended with ``finish_reason``:
    a truncated attempt's retry runs with ``max_tokens × factor`` (rounded up), any other keeps
    ``max_tokens`` (a retry never runs with fewer tokens than the last attempt did); either at most
    the cap, whatever ``max_tokens`` says. ``max_tokens`` ``None`` (a row written before rows carried
    it): the job's own. ``in_thinking``: the attempt was cut while still thinking (with ``length``
    only); its ``thinking_token_budget`` (``None``: it ran without one) is raised by the same factor,
    at most the retry's ``max_tokens``."""
    cap = policy.max_tokens_cap
    if finish_reason != LENGTH:
        kept = max_tokens if cap is None or max_tokens is None else min(max_tokens, cap)
        return Decision(truncated=False, reject=False, max_tokens=kept)
    reject = policy.mode == "reject"
    if in_thinking:
        return _cut_in_thinking(attempt, max_tokens, thinking_token_budget, policy, reject)
    cut = f"{TRUNCATED}: attempt {attempt} stopped at max_tokens"
    if max_tokens is None:
        return Decision(
            True, reject, None, reason=f"{cut} (finish_reason length); a retry runs with the job's"
        )
    nxt, at_cap = _raised(max_tokens, policy)
    cut = f"{cut} {max_tokens} (finish_reason length)"
    if at_cap and nxt <= max_tokens:
        reason = (
            f"{cut}, at the deployment's cap (max_max_tokens {cap}): a retry gets no more tokens; "
            f"remedy: {CAP_REMEDY}"
        )
    elif at_cap:
        reason = f"{cut}; a retry runs with max_tokens {nxt}, the deployment's cap (max_max_tokens)"
    elif nxt == max_tokens:
        reason = f"{cut}; a retry runs with {nxt} again (truncated_max_tokens_factor 1 raises none)"
    else:
        reason = f"{cut}; a retry runs with max_tokens {nxt}"
    return Decision(True, reject, nxt, at_cap, reason)


def _raised(max_tokens: int, policy: TruncationPolicy) -> tuple[int, bool]:
    """``max_tokens × factor`` (rounded up, never less) at most the cap, and whether it is the cap."""
    cap = policy.max_tokens_cap
    raised = max(max_tokens, math.ceil(max_tokens * policy.max_tokens_factor))
    nxt = raised if cap is None else min(raised, cap)
    return nxt, cap is not None and nxt >= cap


def _cut_in_thinking(
    attempt: int, max_tokens: int | None, budget: int | None, policy: TruncationPolicy, reject: bool
) -> Decision:
    """The decision on an attempt cut while still thinking: no answer at all, so the retry gets more
    of both budgets (the thinking one only when the attempt ran with one)."""
    ran = ["the job's max_tokens" if max_tokens is None else f"max_tokens {max_tokens}"]
    if budget is not None:
        ran.append(f"thinking_token_budget {budget}")
    cut = (
        f"{TRUNCATED_IN_THINKING}: attempt {attempt} spent its whole budget thinking ({', '.join(ran)}; "
        "finish_reason length, reasoning not ended): no answer"
    )
    if max_tokens is None:
        return Decision(True, reject, None, reason=f"{cut}; a retry runs with the job's", in_thinking=True)
    nxt, at_cap = _raised(max_tokens, policy)
    thinking, more = None, f"max_tokens {nxt}"
    if budget is not None:
        thinking = min(max(budget, math.ceil(budget * policy.max_tokens_factor)), nxt)
        more += f" and thinking_token_budget {thinking}"
    if at_cap and nxt <= max_tokens and (budget is None or thinking == budget):
        reason = (
            f"{cut}; at the deployment's cap (max_max_tokens {policy.max_tokens_cap}): a retry gets no more "
            "tokens; remedy: a lower reasoning_effort or thinking_token_budget, or ask for a higher "
            "max_max_tokens"
        )
    elif at_cap:
        reason = f"{cut}; a retry runs with {more}, the deployment's cap (max_max_tokens)"
    else:
        reason = f"{cut}; a retry runs with {more}"
    return Decision(True, reject, nxt, at_cap, reason, in_thinking=True, thinking_token_budget=thinking)


def _ran_with(row: Mapping[str, Any]) -> int | None:
    value = row.get("max_tokens")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def row_decision(row: Mapping[str, Any], policy: TruncationPolicy) -> Decision:
    """:func:`decide` for a row of a job (its ``finish_reason``, ``attempts``, ``max_tokens``,
    ``truncated_in_thinking`` and ``thinking_token_budget``)."""
    attempt = row.get("attempts")
    return decide(
        row.get("finish_reason"),
        attempt if isinstance(attempt, int) else 1,
        _ran_with(row),
        policy,
        in_thinking=row.get(TRUNCATED_IN_THINKING) is True,
        thinking_token_budget=_thinking_budget(row),
    )


def _thinking_budget(row: Mapping[str, Any]) -> int | None:
    value = row.get(THINKING_BUDGET)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def thinking_budget(sampling: object) -> int | None:
    """The ``thinking_token_budget`` a request's sampling runs with (``None``: none), read by name:
    the field is the engines' (a row records it, so a retry cut in thinking can raise it)."""
    value = getattr(sampling, THINKING_BUDGET, None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def tightest_cap(*caps: int | None) -> int | None:
    """The lowest of the caps that are set (``None``: none is)."""
    given = [c for c in caps if c is not None]
    return min(given) if given else None
