"""``{"type": "human"}``: a person judges every sample, on the review page, between rounds.

The worker asks no model: every inferred row goes to the round's rejected set marked
``for_review``, and the review gate after the round always opens. Reviewers approve (accept) or
reject (retry in the next round) each sample, one by one or by filter; what nobody decided follows
the gate's answer (Continue retries it, "Accept remaining" accepts it, Stop leaves it pending).
"""

from __future__ import annotations

from collections.abc import Sequence

from airflow_batchinfer.judges.base import Generate, Judge, JudgeItem, Verdict

AWAITING = "awaiting a person's verdict"


class HumanJudge(Judge):
    kind = "human"

    async def judge(self, items: Sequence[JudgeItem], generate: Generate | None = None) -> list[Verdict]:
        return [Verdict(False, AWAITING) for _ in items]
