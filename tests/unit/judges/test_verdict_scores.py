"""Issue 37 item 7: an llm judge's score is held to its documented range, [0, 1], on every engine
(the transformers engine does not enforce the verdict schema): a score outside it, or a non-finite
one (JSON ``Infinity``/``NaN``), is an ``invalid_judgment``, so a ``mean_score`` jury whose members
all reject cannot approve because one wrote 7."""

from __future__ import annotations

import pytest

from airflow_batchinfer.engines.base import GenerationRequest, GenerationResult
from airflow_batchinfer.judges import JudgeItem, Jury, build_judge, parse_verdict

pytestmark = pytest.mark.security


@pytest.mark.parametrize(
    "score", ["7", "-0.5", "1.0001", "Infinity", "-Infinity", "NaN", "1e400", '"0.9"', "true"]
)
def test_a_score_outside_0_1_or_not_finite_is_an_invalid_judgment(score: str) -> None:
    verdict = parse_verdict(f'{{"approved": true, "reason": "fine", "score": {score}}}')
    assert verdict.approved is False
    assert verdict.reason.startswith("invalid_judgment: score")
    assert verdict.score is None


@pytest.mark.parametrize(("score", "kept"), [("0", 0.0), ("1", 1.0), ("0.25", 0.25), ("null", None)])
def test_a_score_in_range_or_none_is_kept(score: str, kept: float | None) -> None:
    verdict = parse_verdict(f'{{"approved": true, "reason": "fine", "score": {score}}}')
    assert (verdict.approved, verdict.score) == (True, kept)


async def test_a_mean_score_jury_of_rejecting_members_does_not_approve() -> None:
    # three free-text llm members (as on transformers: no verdict schema); all reject, one scores 7
    answers = iter(
        [
            '{"approved": false, "reason": "wrong", "score": 0.1}',
            '{"approved": false, "reason": "wrong", "score": 0.1}',
            '{"approved": false, "reason": "wrong", "score": 7}',
        ]
    )

    async def generate(requests: list[GenerationRequest]) -> list[GenerationResult]:
        return [GenerationResult(next(answers)) for _ in requests]

    jury = build_judge(
        {"type": "jury", "vote": "mean_score", "judges": [{"type": "llm"}, {"type": "llm"}, {"type": "llm"}]},
        callables=None,
        engine="transformers",
    )
    assert isinstance(jury, Jury)
    (verdict,) = await jury.judge([JudgeItem({"prompt": "2+2?"}, "5", "1")], generate)
    assert verdict.approved is False
    assert verdict.score is not None and verdict.score < 0.5
