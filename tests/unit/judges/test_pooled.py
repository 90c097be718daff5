"""The judges of pooling rows (judges.pooled)."""

from __future__ import annotations

from airflow_batchinfer.engines.scoring import ScoringModel
from airflow_batchinfer.judges.base import JudgeItem
from airflow_batchinfer.judges.pooled import LabelJudge


def test_a_generated_rows_own_label_and_probs_columns_are_not_the_models() -> None:
    judge = LabelJudge(["positive"])
    row = {"label": "positive", "probs": {"positive": 1.0}, "result": "negative"}
    verdict = judge.check(JudgeItem(row, " negative ", "r1"))
    assert not verdict.approved and verdict.score is None
    assert "label negative not kept" in verdict.reason
    # nor does a generate run's own task column make them the model's
    forged = judge.check(JudgeItem({**row, "task": "classify"}, "negative", "r1"))
    assert not forged.approved and forged.score is None


def test_a_classify_rows_label_and_probs_are_judged() -> None:
    judge = LabelJudge(["positive"])
    row = {"task": "classify", "label": "positive", "result": "positive", "probs": {"positive": 0.75}}
    verdict = judge.check(JudgeItem(row, "positive", "r1"))
    assert verdict.approved and verdict.score == 0.75


def test_a_kept_label_the_classifier_lacks_is_refused_naming_its_labels() -> None:
    model = ScoringModel("/models/sentiment", ("NEGATIVE", "POSITIVE"))
    refusal = LabelJudge(["POSITVE"]).serving_refusal(model)
    assert refusal is not None and "['POSITVE']" in refusal and "['NEGATIVE', 'POSITIVE']" in refusal
    assert LabelJudge(["POSITIVE"]).serving_refusal(model) is None
    assert LabelJudge(["yes"]).serving_refusal(None) is None  # a generating worker: free-text answers
