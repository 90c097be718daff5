"""Reward and classifier judges: spec checks, what they score, how a threshold decides, and when a
worker refuses them. The scoring model is a fake at the ``Scorer`` seam (the real ones: the engines'
and the integration tests)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

from airflow_batchinfer.engines.scoring import ScoreRequest, ScoreResult, ScoringModel
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges import JudgeItem, build_judge, judge_needs
from airflow_batchinfer.judges.base import Scorer
from airflow_batchinfer.prompts.build import PromptBuilder
from airflow_batchinfer.prompts.retries import Previous, RetrySettings

MODEL = ScoringModel("/models/judge", ("rejected", "approved"))


def fake_scorer(
    logits: Callable[[ScoreRequest], tuple[float, ...] | str],
    model: ScoringModel = MODEL,
    prompts: PromptBuilder | None = None,
) -> tuple[Scorer, list[ScoreRequest]]:
    """A scorer answering ``logits(request)`` (a string: that request's error), and the requests it saw."""
    seen: list[ScoreRequest] = []

    async def score(requests: list[ScoreRequest]) -> list[ScoreResult]:
        seen.extend(requests)
        out = []
        for r in requests:
            found = logits(r)
            out.append(ScoreResult.failed(found) if isinstance(found, str) else ScoreResult(found))
        return out

    return Scorer(model, score, prompts), seen


def item(i: int, result: str, **record: Any) -> JudgeItem:
    return JudgeItem({"id": i, **record}, result, str(i))


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ({"type": "reward"}, "give a threshold on the reward model's own scale"),
        ({"type": "classifier", "threshold": 1.5}, r"threshold 1.5 is a probability: give one in \[0, 1\]"),
        ({"type": "classifier", "threshold": "high"}, "threshold must be a number"),
        ({"type": "classifier", "label": 1.5}, "label must be a label's name or index"),
        ({"type": "classifier", "model": ""}, "model must be the model's directory"),
        ({"type": "classifier", "template": 3}, "template must be a string"),
        ({"type": "classifier", "temperature": 0}, r"unknown keys \['temperature'\]"),
        ({"type": "reward", "threshold": 0, "template": "{{ result"}, "template"),
    ],
)
def test_bad_specs_are_refused_naming_the_field(spec: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        build_judge(spec, callables=None)


async def test_a_classifier_approves_at_or_above_its_threshold_and_keeps_the_probability() -> None:
    # logit of "approved" = the answer's length - 3; "rejected" at 0
    scorer, _ = fake_scorer(lambda r: (0.0, float(len(r.prompt or "")) - 3))
    judge = build_judge({"type": "classifier", "threshold": 0.5, "template": "{{ result }}"}, callables=None)
    verdicts = await judge.judge([item(1, "ab"), item(2, "abc"), item(3, "abcdef")], scorer=scorer)
    scores = [v.score for v in verdicts]
    assert scores == pytest.approx([1 / (1 + math.e), 0.5, 1 / (1 + math.exp(-3))], abs=1e-6)
    assert [v.approved for v in verdicts] == [False, True, True]  # 0.5 >= 0.5: approved
    assert verdicts[0].reason == "P(approved) 0.2689 < threshold 0.5"
    assert verdicts[2].reason == "P(approved) 0.9526 >= threshold 0.5"


async def test_a_label_picks_the_probability_read() -> None:
    scorer, _ = fake_scorer(lambda r: (2.0, 0.0))
    by_name = build_judge({"type": "classifier", "label": "rejected", "template": "x"}, callables=None)
    by_index = build_judge({"type": "classifier", "label": 0, "template": "x"}, callables=None)
    default = build_judge({"type": "classifier", "template": "x"}, callables=None)
    (a,), (b,), (c,) = [await j.judge([item(1, "x")], scorer=scorer) for j in (by_name, by_index, default)]
    assert a.score == b.score == pytest.approx(1 / (1 + math.exp(-2)), abs=1e-6) and a.approved
    assert c.score == pytest.approx(1 - a.score, abs=1e-6) and not c.approved  # approved by default


async def test_a_reward_judge_keeps_the_raw_score_on_its_scale() -> None:
    model = ScoringModel("/models/rm", ("LABEL_0",))
    scorer, _ = fake_scorer(lambda r: (float(len(r.prompt or "")) - 2.5,), model)
    judge = build_judge({"type": "reward", "threshold": -1, "template": "{{ result }}"}, callables=None)
    verdicts = await judge.judge([item(1, "a"), item(2, "abcd")], scorer=scorer)
    assert [v.score for v in verdicts] == [-1.5, 1.5]
    assert [v.approved for v in verdicts] == [False, True]
    assert verdicts[0].reason == "reward -1.5000 < threshold -1"


async def test_the_conversation_is_the_runs_prompt_with_the_answer_as_the_assistants_turn() -> None:
    prompts = PromptBuilder("What is {{ question }}?", system="Be brief.")
    scorer, seen = fake_scorer(lambda r: (0.0, 1.0), prompts=prompts)
    judge = build_judge({"type": "classifier"}, callables=None)
    batch = {"custom_id": "b", "body": {"messages": [{"role": "user", "content": "hello"}]}}
    await judge.judge(
        [item(1, "4", question="2 + 2", logprobs=[], candidates=[]), JudgeItem(batch, "hi there", "b")],
        scorer=scorer,
    )
    assert seen[0].messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4"},
    ]
    assert seen[1].messages == [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi there"},
    ]  # an OpenAI batch request: its body's messages
    # what the answer's generation added to the row (a jury's carried verdicts, an earlier judgment,
    # other candidates) is not the record the run's prompt was rendered from
    whole = PromptBuilder("{{ record }}")
    scorer, seen = fake_scorer(lambda r: (0.0, 1.0), prompts=whole)
    carried = {"jury_verdicts": {"critic": {"approved": True}}, "judgment": {"approved": False}}
    await judge.judge(
        [item(1, "4", question="2 + 2"), item(1, "4", question="2 + 2", **carried)], scorer=scorer
    )
    assert seen[0].messages == seen[1].messages and "critic" not in str(seen[1].messages)
    # an OpenAI batch request's candidates (n 3, the run's temperature over its body): its conversation
    # is scored, whatever sampling it was answered with
    scorer, seen = fake_scorer(lambda r: (0.0, 1.0), prompts=PromptBuilder("{{ question }}"))
    asked = {"messages": [{"role": "user", "content": "hello"}], "n": 3, "logprobs": True, "top_logprobs": 2}
    (verdict,) = await judge.judge(
        [JudgeItem({"custom_id": "c", "body": asked}, "hi", "c", candidate=2)], scorer=scorer
    )
    assert verdict.approved and seen[0].messages == [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi"},
    ]
    raw = PromptBuilder("Q: {{ question }}\nA: ", chat=False)  # a completion prompt: the answer follows
    scorer, seen = fake_scorer(lambda r: (0.0, 1.0), prompts=raw)
    await judge.judge([item(1, "4", question="2 + 2")], scorer=scorer)
    assert seen[0].prompt == "Q: 2 + 2\nA: 4"


async def test_a_retrys_answer_is_scored_with_the_prompt_its_attempt_was_sent() -> None:
    """The retry template and system message from the second attempt on, told the attempt before (the
    row's ``previous``), as retries.sent_with decided them for the generation."""
    retry = RetrySettings("{{ question }} (last: {{ previous.result }}, {{ previous.reason }})", "Retry.")
    prompts = PromptBuilder("What is {{ question }}?", system="Be brief.", retry=retry)
    scorer, seen = fake_scorer(lambda r: (0.0, 1.0), prompts=prompts)
    judge = build_judge({"type": "classifier"}, callables=None)
    told = Previous(attempt=1, result="5", reason="expected 4").as_dict()
    first = JudgeItem({"id": 1, "question": "2 + 2"}, "5", "1")
    second = JudgeItem({"id": 1, "question": "2 + 2", "previous": told, "attempts": 2}, "4", "1", attempt=2)
    await judge.judge([first, second], scorer=scorer)
    assert [m["content"] for m in seen[0].messages or []] == ["Be brief.", "What is 2 + 2?", "5"]
    assert [m["content"] for m in seen[1].messages or []] == ["Retry.", "2 + 2 (last: 5, expected 4)", "4"]
    # the request the infer job built for that attempt: the same turns before the answer
    sent = prompts.build(second.record, request_id="1", attempt=2, previous=Previous.from_dict(told))
    assert (seen[1].messages or [])[:-1] == sent.messages


async def test_what_cannot_be_scored_is_a_rejection_with_its_reason() -> None:
    prompts = PromptBuilder("{{ question }}")
    scorer, _ = fake_scorer(
        lambda r: "vllm: too long" if "long" in str(r.messages) else (0.0, 1.0), prompts=prompts
    )
    judge = build_judge({"type": "classifier"}, callables=None)
    no_prompt, _ = fake_scorer(lambda r: (0.0, 1.0))  # a judge job without the run's prompt_template
    verdicts = await judge.judge(
        [item(1, "a long answer", question="q"), item(2, "short", question="q")], scorer=scorer
    )
    assert verdicts[0].approved is False and verdicts[0].reason == "judge_error: vllm: too long"
    assert verdicts[0].score is None  # people decide it with review_below_score, as an unread verdict
    assert verdicts[1].approved
    (unrendered,) = await judge.judge([item(1, "x", question="q")], scorer=no_prompt)
    assert not unrendered.approved and "no prompt to score the answer with" in unrendered.reason
    templated = build_judge({"type": "classifier", "template": "{{ missing_field }}"}, callables=None)
    (failed,) = await templated.judge([item(1, "x")], scorer=scorer)
    assert failed.reason.startswith("judge_error:") and "missing_field" in failed.reason


async def test_a_model_judge_needs_a_scoring_model() -> None:
    judge = build_judge({"type": "reward", "threshold": 0}, callables=None)
    with pytest.raises(ConfigError, match="needs a scoring model"):
        await judge.judge([item(1, "x")])


def test_a_worker_refuses_a_model_judge_it_cannot_serve() -> None:
    judge = build_judge({"type": "classifier", "model": "/models/judge"}, callables=None)
    assert judge.serving_refusal(MODEL) is None
    why = judge.serving_refusal(None)
    assert why is not None and "this worker's model generates" in why and "judge_model" in why
    other = build_judge({"type": "classifier", "model": "/models/other"}, callables=None)
    why = other.serving_refusal(MODEL)
    assert why is not None and "names the model /models/other" in why and "serves /models/judge" in why
    unknown = build_judge({"type": "classifier", "label": "toxic"}, callables=None)
    why = unknown.serving_refusal(MODEL)
    assert why is not None and "label 'toxic' is not one of this model's labels" in why
    llm = build_judge({"type": "llm"}, callables=None)
    assert llm.serving_refusal(None) is None
    why = llm.serving_refusal(MODEL)
    assert why is not None and "is a scoring model" in why
    both = build_judge({"type": "all", "judges": [{"type": "llm"}, {"type": "classifier"}]}, callables=None)
    assert both.serving_refusal(MODEL) is not None and both.serving_refusal(None) is not None


def test_descriptions_and_needs() -> None:
    judge = build_judge({"type": "classifier", "label": "approved", "model": "/m"}, callables=None)
    assert judge.describe() == {"type": "classifier", "threshold": 0.5, "label": "approved", "model": "/m"}
    reward = build_judge({"type": "reward", "threshold": 2}, callables=None)
    assert reward.describe() == {"type": "reward", "threshold": 2.0}
    assert judge_needs({"type": "reward", "threshold": 0}) == {"score"}
    assert judge_needs({"type": "any", "judges": [{"type": "llm"}, {"type": "length"}]}) == {"generate"}
    assert judge_needs({"type": "regex", "pattern": "x"}) == frozenset()
