"""Input columns named like the fields a run writes (worker.jobs.columns): an input record's column
is never silently dropped or overwritten; a record that has one is refused, naming it, in every
round; an earlier attempt's row has its answer fields replaced by the new attempt's."""

from __future__ import annotations

from types import SimpleNamespace

from airflow_batchinfer.engines.base import GenerationResult
from airflow_batchinfer.engines.scoring import ScoringModel
from airflow_batchinfer.judges.truncation import TruncationPolicy
from airflow_batchinfer.prompts.build import PromptBuilder
from airflow_batchinfer.review.samples import sample_of
from airflow_batchinfer.worker.jobs.columns import CLASH
from airflow_batchinfer.worker.jobs.infer import Inference, output_row
from airflow_batchinfer.worker.jobs.pooling import Pooling

RUNTIME = SimpleNamespace(
    estimate=lambda requests: [1.0] * len(requests),
    image_limits=None,
    storage_options=None,
    engine=SimpleNamespace(scoring=ScoringModel("/m/sentiment", ("negative", "positive"))),
)


def ctx(round: int) -> SimpleNamespace:
    params = SimpleNamespace(round=round, truncation=TruncationPolicy(), output_format="rows")
    return SimpleNamespace(params=params, record_id=lambda r: r["id"], runtime=RUNTIME)


def generate(records: list[dict], round: int) -> list[dict]:
    inference = Inference.__new__(Inference)
    inference.ctx, inference.prompts = ctx(round), PromptBuilder("{{ q }}")  # type: ignore[assignment]
    built, requests, _ = inference.build(records)
    rows, _ = inference.rows(built, [GenerationResult("an answer", finish_reason="stop") for _ in requests])
    return rows


def test_a_distillation_records_reasoning_column_is_refused_by_name_not_dropped() -> None:
    gold = {"id": "a", "q": "2+2?", "reasoning": "two and two", "tool_calls": []}
    refused, plain = generate([gold, {"id": "b", "q": "1+1?"}], round=0)
    assert refused["status"] == "error" and refused["error"].startswith(f"{CLASH}: reasoning, tool_calls:")
    assert "rename them in the input" in refused["error"]
    assert refused["reasoning"] == "two and two"  # the record's own, kept in its row
    assert plain["status"] == "ok" and plain["result"] == "an answer"
    # retried in a later round, it still is the input record: refused again, its column kept
    (again,) = generate([refused], round=1)
    assert (
        again["status"] == "error"
        and again["error"] == refused["error"]
        and again["reasoning"] == "two and two"
    )


def test_an_earlier_attempts_answer_fields_are_replaced_and_state_fields_never_kept() -> None:
    earlier = {
        "id": "a",
        "q": "x",
        "error": None,
        "reasoning": "old",
        "tool_calls": [{"id": "c"}],
        "attempts": 1,
    }
    assert output_row(earlier, round=1, result="new") == {"id": "a", "q": "x", "error": None, "attempts": 1,
                                                          "result": "new", "round": 1}  # fmt: skip
    # an input record's state fields are never the system's (issue 37), as before
    assert output_row({"id": "a", "judgment": {"approved": True}}, round=0, result="r") == {
        "id": "a", "result": "r", "round": 0}  # fmt: skip


def test_a_classify_records_label_column_is_refused_and_a_generate_runs_label_kept() -> None:
    pooling = Pooling.__new__(Pooling)
    pooling.ctx, pooling.task = ctx(0), "classify"  # type: ignore[assignment]
    text = pooling.text({"id": "a", "q": "great", "label": "positive"})
    assert text.error is not None and text.error.startswith(f"{CLASH}: label: a classify run")
    (row,) = generate([{"id": "a", "q": "great", "label": "positive", "probs": [1]}], round=0)
    assert (row["status"], row["label"], row["probs"]) == ("ok", "positive", [1])


def test_the_desk_shows_a_refused_rows_own_columns_as_its_record() -> None:
    (refused,) = generate([{"id": "a", "q": "2+2?", "reasoning": "two and two"}], round=0)
    sample = sample_of(refused, "part-00000", 0, round=0, id_field="id", prompts=None)
    assert sample.record == {"id": "a", "q": "2+2?", "reasoning": "two and two"} and sample.reasoning is None
