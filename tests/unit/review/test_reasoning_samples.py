"""A reasoning model's rows on the desk (issue 39, item 1): the output is the answer, the reasoning
apart (bounded like the other texts, read whole on demand), never among the record's fields, and a
row cut while thinking in its own reason group."""

from __future__ import annotations

from airflow_batchinfer.judges.truncation import TruncationPolicy, decide
from airflow_batchinfer.review.bounds import Bounds
from airflow_batchinfer.review.samples import field_value, sample_of

CUT = decide("length", 1, 64, TruncationPolicy(), in_thinking=True).reason
ROW = {
    "id": "a", "question": "2+2?", "result": "", "status": "rejected", "finish_reason": "length",
    "max_tokens": 64, "attempts": 1, "round": 0, "reasoning": "hmm " * 1000, "reasoning_tokens": 64,
    "truncated_in_thinking": True, "judgment": {"approved": False, "reason": CUT},
}  # fmt: skip


def test_the_desk_shows_the_reasoning_apart_from_the_answer_and_the_record() -> None:
    sample = sample_of(ROW, "part-00000", 0, round=0, id_field="id", prompts=None)
    assert sample.output == "" and sample.reasoning == ROW["reasoning"]
    assert sample.record == {"id": "a", "question": "2+2?"}  # the record renders the prompt: input only
    assert sample.group == "truncated_in_thinking"
    shown = sample.bounded(Bounds(field_bytes=100))
    head = shown.reasoning or ""
    assert shown.truncated["reasoning"] == 4000 and 0 < len(head) <= 100 and ROW["reasoning"].startswith(head)
    assert field_value(sample, "reasoning") == ROW["reasoning"]
    assert shown.to_dict()["reasoning"] == head
    plain = sample_of({**ROW, "reasoning": None}, "part-00000", 0, round=0, id_field="id", prompts=None)
    assert plain.to_dict()["reasoning"] is None
