"""Judges of the rows of pooling tasks (:mod:`~airflow_batchinfer.engines.pooling`), which make a
classify run a filter round and keep an embed or score run's rows, through the judge step every
round already has (approved rows are results, rejected ones retried or dropped).

- ``{"type": "label", "keep_labels": ["POSITIVE", ...]}``: approves a row whose answer stripped (a
  classify row's ``result``: its ``label``, the likeliest) is one of ``keep_labels``;
  its score is the probability a classify row's ``probs`` give the kept labels together (none for a
  generated row). A generated row's ``label``/``probs`` are its input's columns, never the model's.
- ``{"type": "accept"}``: approves every row whose inference succeeded (an embed or score row has no
  text answer to judge); an errored one is rejected before any judge, and retried.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from airflow_batchinfer.engines.scoring import ScoringModel
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges.base import JudgeItem, Verdict
from airflow_batchinfer.judges.rules import RuleJudge

# the ``task`` a classify row carries (worker.jobs.pooling)
CLASSIFY = "classify"


class LabelJudge(RuleJudge):
    kind = "label"

    def __init__(self, keep_labels: Sequence[str] | None = None) -> None:
        if (
            not isinstance(keep_labels, list | tuple)
            or not keep_labels
            or not all(isinstance(x, str) and x for x in keep_labels)
        ):
            raise ConfigError(
                f"label judge: keep_labels must be a list of the labels to keep (names), got {keep_labels!r}"
            )
        self.keep_labels = tuple(keep_labels)

    def check(self, item: JudgeItem) -> Verdict:
        # the answer: a classify row's result is its label; a generated row's label and probs columns
        # are its input's (ground truth), so probs are read only from a row whose label is its answer
        label = item.result.strip()
        classified = item.record.get("task") == CLASSIFY and item.record.get("label") == item.result
        probs = item.record.get("probs") if classified else None
        score = None
        if isinstance(probs, dict):
            score = min(1.0, sum(float(p) for name, p in probs.items() if name in self.keep_labels))
        if label in self.keep_labels:
            return Verdict(True, f"label {label} kept", score)
        return Verdict(False, f"label {label} not kept ({', '.join(self.keep_labels)})", score)

    def serving_refusal(self, scoring: ScoringModel | None) -> str | None:
        """On a worker serving a classifier, every kept label must be one of its labels: a typo would
        reject every row, round after round (a generating worker's labels are free text)."""
        unknown = [x for x in self.keep_labels if scoring is not None and x not in scoring.labels]
        if scoring is None or not unknown:
            return None
        return (
            f"label judge: keep_labels {unknown} are not labels of {os.path.basename(scoring.path)}, "
            f"whose labels are {list(scoring.labels)}: keep some of those"
        )

    def describe(self) -> dict[str, Any]:
        return {"type": self.kind, "keep_labels": list(self.keep_labels)}


class AcceptJudge(RuleJudge):
    kind = "accept"

    def check(self, item: JudgeItem) -> Verdict:
        return Verdict(True, "accepted")
