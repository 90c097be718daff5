"""What judges see of a reasoning model's answer (issue 39, item 1): the answer only, unless an llm
judge's spec says ``sees_reasoning`` or a rule judge's ``of: reasoning``."""

from __future__ import annotations

import pytest

from airflow_batchinfer.engines import GenerationRequest, GenerationResult
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges import JudgeItem, build_judge
from airflow_batchinfer.judges.llm import DEFAULT_TEMPLATE

ROW = {
    "id": "a",
    "question": "2+2?",
    "result": "4",
    "reasoning": "two and two make four",
    "reasoning_tokens": 6,
}
CANDIDATES = {
    **ROW,
    "candidates": [
        {"index": 0, "result": "4", "reasoning": "first thought"},
        {"index": 1, "result": "5", "reasoning": "second thought"},
    ],
}


async def prompts_of(spec: dict[str, object], items: list[JudgeItem]) -> list[str]:
    seen: list[GenerationRequest] = []

    async def generate(requests: list[GenerationRequest]) -> list[GenerationResult]:
        seen.extend(requests)
        return [GenerationResult('{"approved": true, "reason": "ok"}') for _ in requests]

    await build_judge(spec, callables=None).judge(items, generate)
    return [str(r.messages[-1]["content"]) for r in seen]


async def test_an_llm_judge_sees_the_answer_only_by_default() -> None:
    (prompt,) = await prompts_of({"type": "llm"}, [JudgeItem(ROW, "4", "a")])
    assert "4" in prompt and "two and two" not in prompt and "reasoning_tokens" not in prompt
    # a template of one's own cannot read it either: the variable is not there
    (own,) = await prompts_of(
        {"type": "llm", "template": "{{ result }}|{{ reasoning is defined }}|{{ record }}"},
        [JudgeItem(ROW, "4", "a")],
    )
    assert own.startswith("4|False|") and "two and two" not in own


async def test_sees_reasoning_shows_it_delimited_before_the_answer() -> None:
    (prompt,) = await prompts_of({"type": "llm", "sees_reasoning": True}, [JudgeItem(ROW, "4", "a")])
    assert "<<<REASONING\ntwo and two make four\nREASONING>>>\n\nAnswer:\n4\n" in prompt
    # a row without reasoning says so; a candidate is judged with its own
    (none,) = await prompts_of({"type": "llm", "sees_reasoning": True}, [JudgeItem({"q": 1}, "4", "b")])
    assert "<<<REASONING\n(none)\nREASONING>>>" in none
    items = [JudgeItem(CANDIDATES, "4", "a", candidate=0), JudgeItem(CANDIDATES, "5", "a", candidate=1)]
    own = await prompts_of(
        {"type": "llm", "sees_reasoning": True, "template": "{{ reasoning }}: {{ result }}"}, items
    )
    assert own == ["first thought: 4", "second thought: 5"]


def test_sees_reasoning_is_described_only_when_set_and_checked() -> None:
    plain = build_judge({"type": "llm"}, callables=None).describe()
    assert "sees_reasoning" not in plain and plain["template"] == DEFAULT_TEMPLATE  # fingerprints kept
    seeing = build_judge({"type": "llm", "sees_reasoning": True}, callables=None).describe()
    assert seeing["sees_reasoning"] is True and "{{ reasoning" in seeing["template"]
    with pytest.raises(
        ConfigError, match=r"sees_reasoning is true but its template never reads \{\{ reasoning \}\}"
    ):
        build_judge({"type": "llm", "sees_reasoning": True, "template": "{{ result }}"}, callables=None)
    with pytest.raises(ConfigError, match="sees_reasoning must be true or false"):
        build_judge({"type": "llm", "sees_reasoning": "yes"}, callables=None)


async def test_a_rule_judge_of_the_reasoning_checks_it_instead_of_the_answer() -> None:
    judge = build_judge({"type": "regex", "pattern": "four", "of": "reasoning"}, callables=None)
    items = [
        JudgeItem(ROW, "4", "a"),
        JudgeItem({**ROW, "reasoning": "no idea"}, "4", "b"),
        JudgeItem({}, "4", "c"),
    ]
    verdicts = await judge.judge(items)
    assert [v.approved for v in verdicts] == [True, False, False]
    assert (
        verdicts[0].reason == "reasoning: pattern found"
        and verdicts[1].reason == "reasoning: pattern not found"
    )
    assert verdicts[2].reason.startswith("reasoning: none to check")
    assert judge.describe() == {"type": "regex", "pattern": "four", "must_match": True, "of": "reasoning"}
    # combined with a judge of the answer; "of": "answer" is the default and described as before
    both = build_judge(
        {
            "type": "all",
            "judges": [
                {"type": "regex", "pattern": "^4$", "of": "answer"},
                {"type": "length", "max_chars": 10, "of": "reasoning"},
            ],
        },
        callables=None,
    )
    (v,) = await both.judge([JudgeItem(ROW, "4", "a")])
    assert not v.approved and "reasoning:" in v.reason  # the reasoning is longer than 10 characters
    with pytest.raises(ConfigError, match=r"regex judge: of 'thoughts': choose one of answer, reasoning"):
        build_judge({"type": "regex", "pattern": "x", "of": "thoughts"}, callables=None)
