from __future__ import annotations

import pytest

from airflow_batchinfer.engines import GenerationRequest, GenerationResult
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges import JudgeItem, LLMJudge, Verdict, build_judge, parse_verdict


@pytest.mark.parametrize(
    ("text", "approved", "reason"),
    [
        ('{"approved": true, "reason": "correct", "score": 0.9}', True, "correct"),
        ('Sure!\n```json\n{"approved": false, "reason": "wrong sum"}\n```', False, "wrong sum"),
        ('{"note": 1} then {"approved": true, "reason": "ok"}', True, "ok"),
        ("APPROVED: the answer is right", True, "APPROVED: the answer is right"),
        ("I have to say this is rejected.", False, "I have to say this is rejected."),
    ],
)
def test_parse_valid_verdicts(text: str, approved: bool, reason: str) -> None:
    v = parse_verdict(text)
    assert (v.approved, v.reason) == (approved, reason)


def test_score_is_kept() -> None:
    assert parse_verdict('{"approved": true, "reason": "", "score": 0.75}').score == 0.75


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "   ",
        '{"approved": true, "reason": "trunc',  # truncated JSON: not guessed from the word inside
        '{"approved": "yes"}',  # not a boolean
        "APPROVED? no, REJECTED.",  # both words
        "I cannot decide.",
        "[1, 2, 3]",
    ],
)
def test_anything_unparsable_is_rejected_invalid_judgment(text: str | None) -> None:
    v = parse_verdict(text)
    assert v.approved is False
    assert v.reason.startswith("invalid_judgment")


async def test_llm_judge_renders_record_and_result_and_parses() -> None:
    seen: list[GenerationRequest] = []

    async def generate(requests: list[GenerationRequest]) -> list[GenerationResult]:
        seen.extend(requests)
        return [
            GenerationResult('{"approved": true, "reason": "fine"}'),
            GenerationResult("garbage"),
            GenerationResult.failed("engine hiccup"),
        ]

    judge = LLMJudge("Q: {{ question }}\nA: {{ result }}\nVerdict?")
    items = [JudgeItem({"id": i, "question": f"{i}+{i}"}, f"{2 * i}", str(i), attempt=2) for i in range(3)]
    verdicts = await judge.judge(items, generate)
    assert [v.approved for v in verdicts] == [True, False, False]
    assert verdicts[1].reason.startswith("invalid_judgment")
    assert verdicts[2].reason == "judge_error: engine hiccup"
    assert seen[1].messages[-1]["content"] == "Q: 1+1\nA: 2\nVerdict?"
    assert seen[0].metadata == {"record_id": "0", "attempt": 2, "role": "judge"}
    assert seen[0].sampling.temperature == 0.0


async def test_llm_judge_template_error_rejects_only_that_item() -> None:
    async def generate(requests: list[GenerationRequest]) -> list[GenerationResult]:
        return [GenerationResult('{"approved": true}') for _ in requests]

    judge = build_judge(
        {"type": "llm", "template": "{{ question }} / {{ result }}", "max_tokens": 16}, callables=None
    )
    items = [JudgeItem({"question": "q"}, "a", "1"), JudgeItem({"other": "x"}, "a", "2")]
    verdicts = await judge.judge(items, generate)
    assert verdicts[0] == Verdict(True, "")
    assert not verdicts[1].approved and "question" in verdicts[1].reason


async def test_llm_judge_needs_an_engine() -> None:
    with pytest.raises(ValueError, match="needs an engine"):
        await LLMJudge().judge([JudgeItem({}, "x", "1")])


def test_llm_judge_sampling_as_an_object_or_top_level_and_no_unknown_keys() -> None:
    nested = build_judge({"type": "llm", "sampling": {"max_tokens": 48, "temperature": 0.5}}, callables=None)
    assert (nested.sampling.max_tokens, nested.sampling.temperature) == (48, 0.5)
    top = build_judge({"type": "llm", "max_tokens": 7, "sampling": {"max_tokens": 48}}, callables=None)
    assert top.sampling.max_tokens == 7  # the top level wins
    with pytest.raises(ConfigError, match="unknown keys \\['samplng'\\]"):
        build_judge({"type": "llm", "samplng": {"max_tokens": 48}}, callables=None)
