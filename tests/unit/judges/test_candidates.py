"""Choosing among a record's candidates and scoring them (issue 25, item 3): ``select``, pass@k
(checked against counting every draw), the candidates' counts read back, and an llm judge's
``score: logprob`` from the verdict token's alternatives."""

from __future__ import annotations

import itertools
import math

import pytest

from airflow_batchinfer.engines.base import TokenLogprob
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges import Verdict, build_judge
from airflow_batchinfer.judges.candidates import pass_at_k, select
from airflow_batchinfer.judges.llm import approval_probability
from airflow_batchinfer.state.tally import CandidateTally

YES, NO = Verdict(True, "ok"), Verdict(False, "no")


def test_select_chooses_first_best_or_all_and_the_first_when_none_is_approved() -> None:
    verdicts = [NO, Verdict(True, "a", 0.2), Verdict(True, "b", 0.9), Verdict(True, "c", 0.9)]
    assert (select(verdicts).chosen, select(verdicts).kept) == (1, (1,))
    assert select(verdicts, "best_score").chosen == 2  # a tie: the first of the best
    assert select(verdicts, "all").kept == (1, 2, 3) and select(verdicts, "all").chosen == 1
    assert select([NO, YES, Verdict(True, "s", 0.1)], "best_score").chosen == 2  # unscored: last
    none = select([NO, NO])
    assert (none.ok, none.chosen, none.approved, none.kept) == (False, 0, (), ())


@pytest.mark.parametrize(("n", "c"), [(4, 0), (4, 1), (4, 2), (5, 3), (4, 4), (6, 1)])
def test_pass_at_k_is_the_share_of_k_draws_that_hold_an_approved_one(n: int, c: int) -> None:
    for k in range(1, n + 1):
        draws = list(itertools.combinations(range(n), k))
        hit = sum(any(i < c for i in d) for d in draws) / len(draws)  # candidates 0..c-1 approved
        assert math.isclose(pass_at_k(n, c, k), hit), (n, c, k)


def test_the_counts_sum_and_read_back_as_the_rounds_figures() -> None:
    parts = []
    for verdicts in ([YES, NO], [NO, NO], [NO, YES], [YES, YES]):
        part = CandidateTally()  # a record's, as its chunk counted it
        part.count(2, select(verdicts))
        parts.append(part)
    found = sum(parts, CandidateTally()).stats()
    assert found is not None and (found.n, found.records, found.approved_by_index) == (2, 4, (2, 2))
    # pass@1: each record's share of approved candidates; pass@2: a record with any
    assert found.pass_at == {1: 0.5, 2: 0.75}
    assert CandidateTally().stats() is None  # no record had candidates


def toks(*pairs: tuple[str, list[tuple[str, float]]]) -> list[TokenLogprob]:
    return [TokenLogprob(t, dict(alts).get(t, -5.0), tuple(alts)) for t, alts in pairs]


def test_the_verdict_tokens_alternatives_give_p_approve() -> None:
    text = '{"approved": true, "reason": "ok"}'
    tokens = toks(
        ('{"', []), ("appro", [("appro", -0.01), ("rej", -4.0)]), ("ved", []), ('":', []),
        (" true", [(" true", math.log(0.6)), (" false", math.log(0.3)), (" maybe", math.log(0.1))]),
        (', "reason": "ok"}', []),
    )  # fmt: skip
    assert "".join(t.token for t in tokens) == text
    # the key's tokens ("appro") are not the verdict: the value's are; an unrelated one is left out
    assert approval_probability(tokens) == round(0.6 / 0.9, 4)
    words = toks(("REJECT", [("REJECT", math.log(0.8)), ("APPRO", math.log(0.2))]), ("ED: wrong", []))
    assert approval_probability(words) == 0.2
    assert approval_probability(toks(("no verdict here", []))) is None


def test_score_logprob_is_refused_on_an_engine_without_logprobs_and_described() -> None:
    with pytest.raises(ConfigError, match="score logprob reads the verdict token's log probabilities"):
        build_judge({"type": "llm", "score": "logprob"}, callables=None, engine="simulated")
    with pytest.raises(ConfigError, match="score 'p': choose one of verdict, logprob"):
        build_judge({"type": "llm", "score": "p"}, callables=None)
    judge = build_judge({"type": "llm", "score": "logprob"}, callables=None, engine="vllm")
    described = judge.describe()
    assert described["score"] == "logprob"
    assert (described["sampling"]["logprobs"], described["sampling"]["top_logprobs"]) == (True, 20)
    assert "score" not in build_judge({"type": "llm"}, callables=None).describe()  # as it always was


def test_greedy_candidates_are_refused_naming_the_remedy() -> None:
    from airflow_batchinfer.engines.base import SamplingParams
    from airflow_batchinfer.state.config import RunConfig

    with pytest.raises(ConfigError, match="n 2 with temperature 0 is one greedy answer 2 times"):
        SamplingParams(n=2)
    cfg = RunConfig.of(input="/d/in.jsonl", run_root="/d/run", prompt_template="{{ q }}",
                       judge={"type": "llm"}, sampling={"n": 2})  # fmt: skip
    with pytest.raises(ConfigError, match="set temperature above 0"):
        cfg.validate()
    assert SamplingParams(n=2, temperature=0.5).n == 2


def test_select_prefers_a_candidate_that_passes_review_and_shows_a_truncated_one() -> None:
    low, high = Verdict(True, "a", 0.2), Verdict(True, "b", 0.8)
    assert select([low, high], review_below=0.5).chosen == 1  # the one people need not see
    assert select([low, high], "all", review_below=0.5).kept == (0, 1)
    assert select([low, low], review_below=0.5).chosen == 0  # none passes: the first approved
    assert select([NO, NO, NO], truncated=[False, True, True]).chosen == 1  # its retry gets more tokens


def test_only_the_candidates_a_worker_wrote_are_candidates() -> None:
    from airflow_batchinfer.judges.candidates import of

    worker = [{"index": 0, "result": "a"}, {"index": 1, "result": "b"}]
    assert of({"candidates": worker}) == worker
    for own in (["Ann", "Bob"], [{"name": "Ann"}, {"name": "Bob"}], [{"index": 0, "result": "a"}], "x"):
        assert of({"candidates": own}) is None  # a record's own field of that name


def test_the_logprob_verdict_is_the_object_the_judge_reads_and_scores_its_confidence() -> None:
    import asyncio

    from airflow_batchinfer.engines.base import GenerationRequest, GenerationResult
    from airflow_batchinfer.judges import JudgeItem

    # the model echoes the template's example before its verdict: the example is not the verdict
    echo = '{"approved": true or false} then '
    verdict = '{"approved": false, "reason": "wrong"}'
    tokens = toks(
        (echo[:13], []), (echo[13:17], [("true", math.log(0.9)), ("false", math.log(0.1))]),
        (echo[17:], []),
        (verdict[:13], []), (verdict[13:19], [(" false", math.log(0.7)), (" true", math.log(0.3))]),
        (verdict[19:], []),
    )  # fmt: skip
    text = echo + verdict
    assert "".join(t.token for t in tokens) == text
    assert approval_probability(tokens) == 0.3

    async def generate(requests: list[GenerationRequest]) -> list[GenerationResult]:
        assert all(r.sampling.logprobs and r.sampling.top_logprobs == 20 for r in requests)
        assert "other candidate" not in str(requests[0].messages)  # the record, not its generation
        return [GenerationResult(text, logprobs=tuple(tokens))]

    judge = build_judge({"type": "llm", "score": "logprob"}, callables=None, engine="vllm")
    record = {"prompt": "q", "candidates": [{"index": 1, "result": "other candidate"}], "result": "x"}
    (got,) = asyncio.run(judge.judge([JudgeItem(record, "an answer", "r1")], generate))
    # a rejection, scored by the model's confidence in it: 1 - P(approve)
    assert (got.approved, got.score) == (False, 0.7)


def test_a_run_whose_pool_gives_no_logprobs_is_refused_a_logprob_judge() -> None:
    from airflow_batchinfer.state.config import RunConfig

    cfg = RunConfig.of(input="/d/in.jsonl", run_root="/d/run", prompt_template="{{ q }}",
                       judge={"type": "llm", "score": "logprob"})  # fmt: skip
    why = cfg.engine_refusal("simulated")
    assert why is not None and "score logprob" in why and "simulated engine" in why
    assert cfg.engine_refusal("vllm") is None
