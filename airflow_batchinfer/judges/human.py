"""``{"type": "human"}``: a person judges every sample, on the review page, between rounds.

The worker asks no model: every inferred row goes to the round's rejected set marked
``for_review``, and the review gate after the round always opens. Reviewers approve (accept) or
reject (retry in the next round) each sample, one by one or by filter; what nobody decided follows
the gate's answer (Continue retries it, "Accept remaining" accepts it, Stop leaves it pending).
"""

from __future__ import annotations

from collections.abc import Sequence

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges.base import Generate, Judge, JudgeItem, Scorer, Verdict

AWAITING = "awaiting a person's verdict"


class HumanJudge(Judge):
    kind = "human"

    async def judge(
        self, items: Sequence[JudgeItem], generate: Generate | None = None, scorer: Scorer | None = None
    ) -> list[Verdict]:
        return [Verdict(False, AWAITING) for _ in items]


def judges_in_place(judge_type: object) -> bool:
    """Whether a judge of ``judge_type`` (a judge spec's ``type``) can judge inside a job, as retries
    in place need: every judge but people, who answer between rounds on the review page. The one
    rule behind the run's ``strategy``, a worker's ``in_place`` job and the review gate's options
    (no "Continue in place")."""
    return judge_type != HumanJudge.kind


def require_judge_in_place(judge_type: object, *, what: str) -> None:
    """:class:`ConfigError` when a judge of ``judge_type`` cannot judge in place
    (:func:`judges_in_place`); ``what`` names what would retry in place."""
    if not judges_in_place(judge_type):
        raise ConfigError(
            f"a human judge cannot retry in place ({what}): people judge between rounds on the review "
            "page, and no person answers inside a job. Use strategy rounds"
        )
