"""Candidates: with ``n`` > 1 a record has several answers, each judged; the run's ``select`` decides
what reaches ``results/``, and a round counts approval per candidate index and pass@k.

A record is still one row (the id invariant holds per record, whatever ``n`` is): approved when
some candidate is, its ``result`` the chosen candidate's text and ``candidate`` its index.

- ``first_approved`` (the default): the first approved candidate.
- ``best_score``: the approved candidate with the highest score (unscored ones last; a tie: the
  first), e.g. an llm judge's ``score: logprob``.
- ``all``: every approved candidate (the row's ``candidates``), ``result`` the first of them.

A rejected row keeps every candidate with its verdict (for people, and for the next round, which
generates ``n`` new ones). A job counts its records' candidates
(:class:`~airflow_batchinfer.state.tally.CandidateTally`), which sum over chunks, jobs and shards
like every other count; :func:`stats` gives a round's summary from them: approval per candidate
index, and pass@k for k = 1..n by the unbiased estimator ``1 - C(n-c, k) / C(n, k)`` (c of a
record's n candidates approved), averaged over records.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from airflow_batchinfer.engines.reasoning import ROW_FIELDS
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges.base import Verdict

SELECTS = ("first_approved", "best_score", "all")
DEFAULT_SELECT = "first_approved"

#: What a row says of its generation and verdict besides ``result``, ``status`` and the like: a
#: record retried carries its earlier ones, which a new generation replaces (``worker.jobs.infer``),
#: and which the review page shows as output, not as the record (``review.samples``). ``previous``:
#: what a retry's prompt was told of the attempt before it; ``sent_back``: a reviewer's retry decision
#: on it, for that prompt (``retries``); neither is shown to a judge. A reasoning model's
#: ``reasoning`` (and its ``reasoning_tokens``), ``truncated_in_thinking`` and the
#: ``thinking_token_budget`` it ran with are written only when they apply, so a retry's row must not
#: keep an earlier attempt's; a judge sees the reasoning only when its spec asks (``sees_reasoning``).
GENERATION_FIELDS = frozenset(
    {
        "judgment",
        "candidates",
        "candidate",
        "logprobs",
        "tool_calls",
        "jury_verdicts",
        "previous",
        "sent_back",
        *ROW_FIELDS,
        "thinking_token_budget",
    }
)
#: The one of them that carries the verdicts of jury members judged where the answer was generated
#: (:mod:`~airflow_batchinfer.judges.jury`), from the infer job to the judge job.
JURY_VERDICTS = "jury_verdicts"


def of(row: Mapping[str, object]) -> list[Mapping[str, object]] | None:
    """The candidates a worker wrote into ``row`` (``n`` > 1): a list of at least two objects with
    ``index`` and ``result``; ``None`` for anything else (a record's own field of that name)."""
    found = row.get("candidates")
    if not isinstance(found, list) or len(found) < 2:
        return None
    if all(isinstance(c, Mapping) and "index" in c and "result" in c for c in found):
        return found
    return None


def check_select(value: object) -> str:
    if value not in SELECTS:
        raise ConfigError(f"select {value!r}: choose one of {', '.join(SELECTS)}")
    return str(value)


@dataclass(frozen=True)
class Selection:
    """What ``select`` made of a record's verdicts: ``chosen`` (the candidate whose text is the row's
    result: the first when none is approved), the ``approved`` indices and those results keep."""

    chosen: int
    approved: tuple[int, ...]
    kept: tuple[int, ...]

    @property
    def ok(self) -> bool:
        return bool(self.approved)


def select(
    verdicts: Sequence[Verdict],
    how: str = DEFAULT_SELECT,
    *,
    review_below: float | None = None,
    truncated: Sequence[bool] = (),
) -> Selection:
    """The selection of a record whose candidates got ``verdicts`` (in candidate order).

    :param review_below: the run's ``review_below_score``: an approved candidate scored below it
        would go to people, so the first one that passes on its own is chosen before it.
    :param truncated: which candidates were cut at ``max_tokens``: with none approved, the first
        truncated one is chosen (the row's ``finish_reason`` says so, and its retry gets more tokens).
    """
    approved = tuple(i for i, v in enumerate(verdicts) if v.approved)
    if not approved:
        cut = next((i for i, t in enumerate(truncated) if t), 0)
        return Selection(cut, (), ())
    if how == "best_score":
        best = max(approved, key=lambda i: (verdicts[i].score is not None, verdicts[i].score or 0.0, -i))
        return Selection(best, approved, (best,))

    def passes(i: int) -> bool:
        score = verdicts[i].score
        return review_below is None or (score is not None and score >= review_below)

    first = next((i for i in approved if passes(i)), approved[0])
    return Selection(first, approved, approved if how == "all" else (first,))


# ------------------------------------------------------------------------------------------ figures
def pass_at_k(n: int, c: int, k: int) -> float:
    """The chance that k of n candidates, drawn without replacement, include one of the c approved."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass(frozen=True)
class CandidateStats:
    """A round's candidates: ``records`` judged with ``n`` each, ``approved_by_index[i]`` records
    whose candidate i was approved, and ``pass_at[k]`` for k = 1..n."""

    n: int
    records: int
    approved_by_index: tuple[int, ...]
    pass_at: dict[int, float]

    def as_json(self) -> dict[str, object]:
        return {
            "n": self.n,
            "records": self.records,
            "approved_by_index": list(self.approved_by_index),
            "pass_at": {str(k): v for k, v in self.pass_at.items()},
        }


def stats(by_record: Mapping[tuple[int, int], int], by_index: Mapping[int, int]) -> CandidateStats | None:
    """A round's candidates' figures from its tally: ``by_record[(c, n)]`` records had ``c`` of ``n``
    candidates approved, ``by_index[i]`` their candidate ``i`` (``None``: no record had more than one)."""
    records = sum(by_record.values())
    n = max((n for _, n in by_record), default=0)
    if records == 0 or n < 2:
        return None
    pass_at = {}
    for k in range(1, n + 1):
        # a record with fewer than k candidates (n changed between rounds' plans: not in one round)
        # counts as its own pass@n
        total = sum(pass_at_k(rn, c, min(k, rn)) * count for (c, rn), count in by_record.items())
        pass_at[k] = round(total / records, 4)
    return CandidateStats(n, records, tuple(by_index.get(i, 0) for i in range(n)), pass_at)
