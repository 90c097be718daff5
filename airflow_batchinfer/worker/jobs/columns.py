"""What a new row keeps of the record it is made from, and the input columns a run refuses.

A row is its record with the job's fields. The system's own state fields (a verdict, candidates,
logprobs, ``previous``, ``sent_back``, ...: :data:`STATE_FIELDS`) are never taken from an input record
(issue 37: user data, not state) and a new attempt replaces an earlier one's, so they are always left
out. The fields of an answer or a pooling output (:func:`written`: ``reasoning``, ``tool_calls``,
``label``, ``embedding``, ...) are common column names of datasets: an earlier attempt's row has them
left out (the new attempt writes its own), but an input record that has one is refused, that record's
error naming the columns and the remedy, rather than its column silently dropped or overwritten. The
refusal holds in later rounds: the refused row still is the input record, not an earlier attempt's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_batchinfer.engines.budget import THINKING_BUDGET
from airflow_batchinfer.engines.pooling import GENERATE
from airflow_batchinfer.engines.reasoning import ROW_FIELDS
from airflow_batchinfer.judges.candidates import GENERATION_FIELDS

#: A generated row's fields of its answer, written only when they apply.
ANSWER_FIELDS = frozenset({*ROW_FIELDS, THINKING_BUDGET, "tool_calls"})
#: A pooling row's fields (worker.jobs.pooling).
POOLING_FIELDS = frozenset(
    {"task", "label", "probs", "score", "scores", "embedding", "embeddings", "dimensions", "embedding_dtype"}
)
#: The system's state fields, never an input record's.
STATE_FIELDS = GENERATION_FIELDS - ANSWER_FIELDS
CLASH = "input columns the run writes"  # the start of a refused record's error


def written(task: str) -> frozenset[str]:
    """The fields a ``task`` run writes to its rows beside ``result``, ``status`` and the like."""
    return ANSWER_FIELDS if task == GENERATE else POOLING_FIELDS


def earlier_attempt(record: Mapping[str, Any], round: int) -> bool:
    """Whether ``record`` is a row an earlier attempt wrote (a later round's, not refused for its
    columns), whose answer fields are the run's."""
    return round >= 1 and not str(record.get("error") or "").startswith(CLASH)


def clash(record: Mapping[str, Any], round: int, task: str) -> str | None:
    """The error of an input record that has columns a ``task`` run writes; ``None``: it has none."""
    if earlier_attempt(record, round):
        return None
    names = sorted(set(record) & written(task))
    if not names:
        return None
    return (
        f"{CLASH}: {', '.join(names)}: a {task} run writes fields of these names to its rows, so the "
        f"record's own would be lost: rename them in the input (e.g. input_{names[0]}) and read those names"
    )


def base(record: Mapping[str, Any], round: int, task: str) -> dict[str, Any]:
    """The fields of ``record`` a new row of a ``task`` run in round ``round`` starts from."""
    drop = STATE_FIELDS | written(task) if earlier_attempt(record, round) else STATE_FIELDS
    return {k: v for k, v in record.items() if k not in drop}
