"""The judges of pooling rows (judges.pooled)."""

from __future__ import annotations

from airflow_batchinfer.judges.base import JudgeItem
from airflow_batchinfer.judges.pooled import LabelJudge


def test_a_generated_rows_own_label_and_probs_columns_are_not_the_models() -> None:
    judge = LabelJudge(["positive"])
    row = {"label": "positive", "probs": {"positive": 1.0}, "result": "negative"}
    verdict = judge.check(JudgeItem(row, " negative ", "r1"))
    assert not verdict.approved and verdict.score is None
    assert "label negative not kept" in verdict.reason


def test_a_classify_rows_label_and_probs_are_judged() -> None:
    judge = LabelJudge(["positive"])
    row = {"task": "classify", "label": "positive", "probs": {"positive": 0.75, "negative": 0.25}}
    verdict = judge.check(JudgeItem(row, "positive", "r1"))
    assert verdict.approved and verdict.score == 0.75
