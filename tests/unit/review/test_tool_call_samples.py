"""An answer's tool calls on the desk: shown under the output as JSON, bounded like the other texts,
read whole on demand, never among the record's fields."""

from __future__ import annotations

import json

from airflow_batchinfer.review.bounds import Bounds
from airflow_batchinfer.review.samples import field_value, sample_of

CALLS = [
    {
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": "lookup", "arguments": json.dumps({"q": "x" * 80})},
    }
    for i in range(3)
]
ROW = {
    "id": "a", "question": "weather?", "result": "", "status": "rejected", "finish_reason": "tool_calls",
    "attempts": 1, "round": 0, "tool_calls": CALLS,
    "judgment": {"approved": False, "reason": "no call expected"},
}  # fmt: skip


def test_the_desk_shows_an_answers_tool_calls_as_bounded_json() -> None:
    sample = sample_of(ROW, "part-00000", 0, round=0, id_field="id", prompts=None)
    assert sample.tool_calls is not None and json.loads(sample.tool_calls) == CALLS
    assert "\n  " in sample.tool_calls  # pretty, one key a line
    assert "tool_calls" not in sample.record
    shown = sample.bounded(Bounds(field_bytes=100))
    head = shown.to_dict()["tool_calls"]
    assert shown.truncated["tool_calls"] == len(sample.tool_calls.encode()) and 0 < len(head) <= 100
    assert sample.tool_calls.startswith(head) and field_value(sample, "tool_calls") == sample.tool_calls
    plain = sample_of({**ROW, "tool_calls": None}, "part-00000", 0, round=0, id_field="id", prompts=None)
    assert plain.to_dict()["tool_calls"] is None
