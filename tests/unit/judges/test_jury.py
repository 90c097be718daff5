"""Juries: spec checks, the vote rules (ties, missing scores), each member's verdict in the judgment,
members judged where the answers are generated, and the counts a round's summary reads."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from airflow_batchinfer.batching import DynamicBatcher
from airflow_batchinfer.engines.base import GenerationRequest, GenerationResult
from airflow_batchinfer.engines.scoring import ScoreRequest, ScoreResult, ScoringModel
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges import JudgeItem, Jury, Verdict, build_judge, judged_early
from airflow_batchinfer.judges.base import Judge, Scorer
from airflow_batchinfer.judges.jury import CARRIED, Member, vote
from airflow_batchinfer.state.tally import JuryTally

REGEX_DIGIT = {"type": "regex", "pattern": "[0-9]"}
SHORT = {"type": "length", "max_chars": 3}
NOT_EMPTY = {"type": "length", "min_chars": 1}


def jury(*members: dict[str, Any], how: str = "majority", **extra: Any) -> Jury:
    judge = build_judge({"type": "jury", "judges": list(members), "vote": how, **extra}, callables=None)
    assert isinstance(judge, Jury)
    return judge


def v(approved: bool, score: float | None = None) -> Verdict:
    return Verdict(approved, "", score)


@pytest.mark.parametrize(
    ("how", "verdicts", "approved", "score"),
    [
        ("majority", [v(True), v(True), v(False)], True, 0.6667),
        ("majority", [v(True), v(False)], False, 0.5),  # a tie rejects
        ("majority", [v(True), v(True), v(False), v(False)], False, 0.5),
        ("majority", [v(False), v(False), v(True)], False, 0.3333),
        ("all", [v(True), v(True), v(True)], True, 1.0),
        ("all", [v(True), v(True), v(False)], False, 0.6667),
        # mean_score: a member without a score counts 1 approved, 0 rejected
        ("mean_score", [v(True, 0.9), v(False, 0.2)], True, 0.55),
        ("mean_score", [v(True, 0.4), v(False)], False, 0.2),
        ("mean_score", [v(True), v(False, 0.0)], True, 0.5),  # at the threshold: approved
        ("mean_score", [v(False), v(False)], False, 0.0),
    ],
)
def test_vote_rules(how: str, verdicts: list[Verdict], approved: bool, score: float) -> None:
    assert vote(how, verdicts) == (approved, pytest.approx(score, abs=1e-4))


def test_a_mean_score_threshold() -> None:
    assert vote("mean_score", [v(True, 0.7), v(True, 0.8)], 0.8) == (False, 0.75)
    assert vote("mean_score", [v(True, 0.7), v(True, 0.9)], 0.8) == (True, 0.8)


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ({"judges": [SHORT]}, "at least two judges"),
        ({"judges": [SHORT, {"type": "human"}]}, "a human judge cannot be a member"),
        ({"judges": [SHORT, {"type": "jury", "judges": [SHORT, SHORT]}]}, "a jury judge cannot be a member"),
        (
            {"judges": [SHORT, SHORT], "vote": "most"},
            "jury vote 'most': choose one of majority, all, mean_score",
        ),
        ({"judges": [SHORT, SHORT], "threshold": 0.5}, "threshold is for vote mean_score, not majority"),
        (
            {"judges": [SHORT, SHORT], "vote": "mean_score", "threshold": 2},
            r"threshold must be a number in \[0, 1\]",
        ),
        (
            {"judges": [SHORT, {"type": "reward", "threshold": 0}], "vote": "mean_score"},
            r"reward members \(reward\) score on their model's own scale",
        ),
        ({"judges": [SHORT, {**SHORT, "name": "bad name"}]}, "jury member name 'bad name'"),
        ({"judges": [{**SHORT, "name": "x"}, {**NOT_EMPTY, "name": "x"}]}, "share the name 'x'"),
        (
            {"judges": [SHORT, {"type": "any", "judges": [{"type": "llm"}, {"type": "classifier"}]}]},
            "jury member any needs both a generating and a scoring model",
        ),
        ({"judges": "all of them"}, "judges must be a list of judge specs"),
        ({"judges": [SHORT, SHORT], "members": 2}, r"unknown keys \['members'\]"),
    ],
)
def test_bad_juries_are_refused_with_the_reason(spec: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        build_judge({"type": "jury", **spec}, callables=None)


async def test_each_members_verdict_is_kept_in_the_judgment() -> None:
    j = jury(REGEX_DIGIT, SHORT, {**NOT_EMPTY, "name": "present"})
    items = [JudgeItem({"id": 1}, "42", "1"), JudgeItem({"id": 2}, "forty-two", "2")]
    first, second = await j.judge(items)
    assert first.approved and first.score == 1.0 and first.reason == "majority: 3 of 3 approve"
    assert not second.approved and second.score == pytest.approx(0.3333, abs=1e-4)
    assert second.reason == "majority: 1 of 3 approve (approved by present)"
    judgment = second.as_dict()
    assert [(m["name"], m["type"], m["approved"]) for m in judgment["members"]] == [
        ("regex", "regex", False),
        ("length", "length", False),
        ("present", "length", True),
    ]
    assert judgment["members"][1]["reason"] == "too long (9 > 3 chars)"


async def test_members_judge_with_the_jobs_model_and_mean_score_reads_their_scores() -> None:
    asked: dict[str, int] = {"generate": 0, "score": 0}

    async def generate(requests: list[GenerationRequest]) -> list[GenerationResult]:
        asked["generate"] += len(requests)
        return [GenerationResult('{"approved": true, "reason": "fine", "score": 0.8}') for _ in requests]

    async def score(requests: list[ScoreRequest]) -> list[ScoreResult]:
        asked["score"] += len(requests)
        return [ScoreResult((0.0, -2.0)) for _ in requests]  # P(approved) 0.1192

    one = [JudgeItem({"id": 1, "question": "q"}, "a", "1")]
    with_llm = jury({"type": "llm"}, NOT_EMPTY, how="mean_score")  # both in the job (a generating pool)
    assert not with_llm.early
    (verdict,) = await with_llm.judge(one, generate)
    assert [m.get("score") for m in verdict.members] == [0.8, None]
    assert verdict.score == pytest.approx(0.9) and verdict.approved
    scorer = Scorer(ScoringModel("/m", ("rejected", "approved")), score)
    with_model = jury(
        {"type": "classifier", "template": "{{ result }}"}, NOT_EMPTY, how="mean_score", threshold=0.6
    )
    (verdict,) = await with_model.judge(one, None, scorer)  # both in the job (a scoring pool)
    assert verdict.members[0]["score"] == pytest.approx(0.1192, abs=1e-4)
    assert verdict.score == pytest.approx((0.1192 + 1.0) / 2, abs=1e-4) and not verdict.approved
    assert verdict.reason == "mean_score 0.5596 < threshold 0.6 (approved by length)"
    assert asked == {"generate": 1, "score": 1}


async def test_llm_members_judge_at_once_and_their_requests_share_the_workers_batches() -> None:
    """Two llm members over one chunk through a real batcher (the worker's shares one among its jobs):
    both members' requests are in its first batch, and the verdicts keep the members' order."""
    batches: list[list[str]] = []

    async def process(requests: list[GenerationRequest]) -> list[GenerationResult]:
        batches.append([(r.messages or [])[-1]["content"] for r in requests])
        return [
            GenerationResult(
                f'{{"approved": {str("strict" not in t or "4" in t).lower()}, "reason": "{t[:6]}"}}'
            )
            for t in batches[-1]
        ]

    j = jury(
        {"type": "llm", "name": "strict", "template": "strict {{ result }}"},
        {"type": "llm", "name": "kind", "template": "kind {{ result }}"},
        REGEX_DIGIT,
    )
    items = [JudgeItem({"id": i}, f"answer {i}", str(i)) for i in (3, 4, 5)]
    async with DynamicBatcher(process, max_batch_size=64, batch_timeout_s=0.5) as batcher:

        async def generate(requests: list[GenerationRequest]) -> list[GenerationResult]:
            return list(await asyncio.gather(*[await batcher.submit(r) for r in requests]))

        verdicts = await j.judge(items, generate)
        early = await jury(
            {"type": "llm", "name": "strict", "template": "strict {{ result }}"},
            {"type": "llm", "name": "kind", "template": "kind {{ result }}"},
            {"type": "classifier"},
        ).judge_early(items, generate)
    # one after the other, the first batch would hold the first member's three requests alone
    assert sorted(batches[0]) == sorted([f"{m} answer {i}" for m in ("strict", "kind") for i in (3, 4, 5)])
    assert sorted(batches[1]) == sorted(batches[0]) and len(batches) == 2  # judge_early's, at once too
    assert [[m["name"] for m in v.members] for v in verdicts] == [["strict", "kind", "regex"]] * 3
    assert [[m["approved"] for m in v.members] for v in verdicts] == [
        [False, True, True],
        [True, True, True],
        [False, True, True],
    ]
    assert [v.members[0]["reason"] for v in verdicts] == ["strict"] * 3
    assert [v.approved for v in verdicts] == [True, True, True]
    assert [sorted(e) for e in early] == [["kind", "strict"]] * 3
    assert [e["strict"]["approved"] for e in early] == [False, True, False]


async def test_a_members_error_is_raised_once_every_member_has_finished() -> None:
    finished: list[str] = []

    class Slow(Judge):
        async def judge(self, items: Any, generate: Any = None, scorer: Any = None) -> list[Verdict]:
            await asyncio.sleep(0.05)
            finished.append("slow")
            return [Verdict(True) for _ in items]

    j = Jury(
        [
            Member("slow", "slow", Slow()),
            Member("classifier", "classifier", build_judge({"type": "classifier"}, callables=None)),
        ]
    )
    with pytest.raises(ConfigError, match="the classifier judge needs a scoring model"):
        await j.judge([JudgeItem({"id": 1}, "a", "1")])  # no scorer: the classifier's error
    assert finished == ["slow"]  # the other member was not left running


def test_beside_a_model_judge_llm_members_are_judged_where_the_answers_are_generated() -> None:
    spec = {"type": "jury", "judges": [{"type": "llm"}, {"type": "classifier"}, REGEX_DIGIT]}
    j = build_judge(spec, callables=None)
    assert isinstance(j, Jury) and judged_early(spec)
    assert [(m.name, m.early) for m in j.members] == [("llm", True), ("classifier", False), ("regex", False)]
    # the judge job's worker scores: its members need a scoring model; the llm member needs a generator
    assert j.serving_refusal(ScoringModel("/m", ("rejected", "approved"))) is None
    assert j.early_refusal(None) is None
    why = j.early_refusal(ScoringModel("/m", ("rejected", "approved")))
    assert why is not None and "jury member llm, judged where the answers are generated" in why
    assert not judged_early({"type": "jury", "judges": [{"type": "llm"}, REGEX_DIGIT]})  # all in the job


async def test_carried_verdicts_are_read_from_the_row_and_its_candidates() -> None:
    j = jury({"type": "llm", "name": "critic"}, {"type": "classifier", "template": "{{ result }}"})

    async def generate(requests: list[GenerationRequest]) -> list[GenerationResult]:
        return [
            GenerationResult(f'{{"approved": {str(len(r.messages or []) > 0).lower()}, "reason": "ok"}}')
            for r in requests
        ]

    async def score(requests: list[ScoreRequest]) -> list[ScoreResult]:
        return [ScoreResult((0.0, 3.0)) for _ in requests]

    scorer = Scorer(ScoringModel("/m", ("rejected", "approved")), score)
    row = {"id": 1, "question": "q"}
    found = await j.judge_early([JudgeItem(row, "a", "1")], generate)  # what the infer job carries
    assert found == [{"critic": {"approved": True, "reason": "ok"}}]
    carried_row = {**row, CARRIED: found[0]}
    (verdict,) = await j.judge([JudgeItem(carried_row, "a", "1")], generate=None, scorer=scorer)
    assert verdict.approved and [m["name"] for m in verdict.members] == ["critic", "classifier"]
    assert verdict.members[0]["reason"] == "ok"
    # a candidate carries its own
    cands = {
        "id": 2,
        "candidates": [
            {
                "index": 0,
                "result": "a",
                CARRIED: {"critic": {"approved": False, "reason": "no", "score": 0.1}},
            },
            {"index": 1, "result": "b", CARRIED: {"critic": {"approved": True, "reason": "yes"}}},
        ],
    }
    v0, v1 = await j.judge(
        [JudgeItem(cands, "a", "2", candidate=0), JudgeItem(cands, "b", "2", candidate=1)], scorer=scorer
    )
    assert (v0.members[0]["approved"], v0.members[0]["score"], v1.members[0]["approved"]) == (
        False,
        0.1,
        True,
    )
    # nothing carried (an inferred file of other settings): that member rejects, saying so
    (lost,) = await j.judge([JudgeItem(row, "a", "1")], scorer=scorer)
    assert (
        not lost.members[0]["approved"]
        and "no verdict of jury member critic carried" in lost.members[0]["reason"]
    )
    assert lost.reason == "majority: 1 of 2 approve (approved by classifier)"


def test_counts_and_the_rounds_figures() -> None:
    unanimous = Verdict(True, "", 1.0, ({"name": "a", "approved": True}, {"name": "b", "approved": True}))
    split = Verdict(False, "", 0.5, ({"name": "a", "approved": True}, {"name": "b", "approved": False}))
    none = JuryTally()
    none.count(Verdict(True))
    assert none == JuryTally() and none.stats() is None  # no jury, no counts
    halves = [JuryTally(), JuryTally()]  # counted apart (two chunks, jobs or shards), added up
    for half, verdict in zip([0, 1, 1], (unanimous, split, split), strict=True):
        halves[half].count(verdict)
    found = (halves[0] + halves[1]).stats()
    assert found is not None
    assert found.as_json() == {
        "voted": 3,
        "split": 2,
        "disagreement_rate": 0.6667,
        "members": {
            "a": {"approved": 3, "rejected": 0, "approval_rate": 1.0},
            "b": {"approved": 1, "rejected": 2, "approval_rate": 0.3333},
        },
    }


def test_description() -> None:
    j = jury({**SHORT, "name": "brief"}, NOT_EMPTY, how="mean_score", threshold=0.7)
    assert j.describe() == {
        "type": "jury",
        "vote": "mean_score",
        "judges": [
            {"name": "brief", "type": "length", "min_chars": 0, "max_chars": 3},
            {"name": "length", "type": "length", "min_chars": 1, "max_chars": None},
        ],
        "threshold": 0.7,
    }
