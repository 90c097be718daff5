"""The calibration of the judge against people (review/calibration.py), without I/O: agreement,
Cohen's kappa (against a hand-computed one, and where it is undefined), precision and recall of
"approve" with the person as truth, each reviewed row weighed by its stratum, per score bucket;
which decisions count; the report's pooled buckets and plot."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_batchinfer.review.calibration import (
    Pair,
    calibrate,
    calibration_chart,
    judge_verdict,
    kappa,
    pair_of,
    pooled,
    scored_in_tenths,
)
from airflow_batchinfer.review.decisions import Decision
from airflow_batchinfer.review.samples import Sample


def table(tp: int, fp: int, fn: int, tn: int, score: float | None = None) -> list[Pair]:
    return (
        [Pair(True, True, score)] * tp
        + [Pair(True, False, score)] * fp
        + [Pair(False, True, score)] * fn
        + [Pair(False, False, score)] * tn
    )


def test_kappa_against_a_hand_computed_one() -> None:
    """20 both approve, 5 judge only, 10 person only, 15 both reject (50 rows):
    p_o = 35/50 = 0.7; judge approves 25/50, person 30/50; p_e = 0.5·0.6 + 0.5·0.4 = 0.5;
    kappa = (0.7 - 0.5) / (1 - 0.5) = 0.4; precision 20/25 = 0.8; recall 20/30."""
    assert kappa(20, 5, 10, 15) == pytest.approx(0.4)
    doc = calibrate(table(20, 5, 10, 15), round=3)
    assert (doc.round, doc.reviewed, doc.weighted, doc.coverage) == (3, 50, False, None)
    assert (doc.agreement, doc.kappa, doc.precision, doc.recall) == (0.7, 0.4, 0.8, 0.6667)
    assert doc.confusion.model_dump() == {
        "both_approve": 20,
        "judge_approves_person_rejects": 5,
        "judge_rejects_person_approves": 10,
        "both_reject": 15,
    }
    assert doc.notes == []
    # another textbook table: p_o = 0.7, p_e = 0.5 again (κ 0.4), from a different split
    assert kappa(25, 10, 5, 10) == pytest.approx((0.7 - (0.7 * 0.6 + 0.3 * 0.4)) / (1 - 0.54))


@pytest.mark.parametrize(
    ("cells", "value"),
    [
        ((10, 0, 0, 10), 1.0),  # perfect agreement
        ((0, 10, 10, 0), -1.0),  # always the opposite
        ((5, 5, 0, 0), 0.0),  # the judge approves everything: no better than chance
        ((10, 0, 0, 0), None),  # both approve everything: p_e = 1, undefined
        ((0, 0, 0, 10), None),  # both reject everything
        ((0, 0, 0, 0), None),  # nothing reviewed
    ],
)
def test_kappa_and_its_undefined_cases(cells: tuple[int, int, int, int], value: float | None) -> None:
    assert kappa(*cells) == (None if value is None else pytest.approx(value))


def test_undefined_figures_say_why() -> None:
    nothing = calibrate([])
    assert (nothing.agreement, nothing.kappa, nothing.precision, nothing.recall) == (None,) * 4
    assert nothing.notes and "no reviewed row" in nothing.notes[0]
    same = calibrate(table(8, 0, 0, 0))
    assert same.kappa is None and same.agreement == 1.0 and same.precision == 1.0 and same.recall == 1.0
    assert any("same verdict" in n for n in same.notes)
    never = calibrate(table(0, 4, 0, 0))  # people approved nothing the judge approved
    assert (
        never.recall is None
        and never.precision == 0.0
        and any("recall is undefined" in n for n in never.notes)
    )


def test_rows_are_weighed_by_the_stratum_they_stand_for() -> None:
    """25 spot checks stand for 250 approved rows (10 each); the 25 rejected rows were all reviewed
    (1 each): the figures estimate the round's 275 judged rows, not the 50 reviewed ones."""
    pairs = table(20, 5, 0, 0, score=0.9) + table(0, 0, 10, 15, score=0.2)
    population = {"approved": {"0.9": 250}, "rejected": {"0.2": 25}}
    doc = calibrate(pairs, population)
    tp, fp, fn, tn = 200, 50, 10, 15  # weighted
    assert doc.weighted and doc.coverage == 1.0
    assert doc.agreement == round((tp + tn) / 275, 4)
    assert doc.precision == 0.8 and doc.recall == round(tp / (tp + fn), 4)
    assert doc.kappa == round(kappa(tp, fp, fn, tn) or 0, 4)
    assert doc.confusion.both_approve == 20  # the counts stay raw
    # unweighted, the same pairs say something else: recall 20/30
    assert calibrate(pairs).recall == 0.6667


def test_buckets_no_reviewed_row_came_from_lend_their_rows_to_the_verdicts_other_buckets() -> None:
    pairs = table(9, 1, 0, 0, score=0.95) + table(0, 0, 2, 8, score=0.1)
    population = {"approved": {"0.9": 100, "0.5": 100}, "rejected": {"0.1": 10}}
    doc = calibrate(pairs, population)
    # the 0.5 bucket's 100 approved rows count as the 0.9 bucket's reviewed ones do: 200 approved
    assert doc.coverage == round(110 / 210, 4)
    assert doc.precision == 0.9
    assert doc.recall == round(180 / (180 + 2), 4)
    assert any("100 of 210 judged rows" in n for n in doc.notes)
    buckets = {b.bucket: b for b in doc.buckets}
    assert buckets["0.5"].reviewed == 0 and buckets["0.5"].agreement is None and buckets["0.5"].rows == 100
    assert buckets["0.5"].judge_approval == 1.0
    assert (buckets["0.9"].agreement, buckets["0.1"].agreement, buckets["0.1"].person_approval) == (
        0.9,
        0.8,
        0.2,
    )


def test_a_verdict_none_of_whose_rows_was_reviewed_leaves_what_needs_it_undefined() -> None:
    """Only rejected rows reviewed (no spot checks): precision, recall and kappa are undefined, not 0."""
    only_rejected = calibrate(
        table(0, 0, 3, 7, score=0.2), {"approved": {"0.9": 90}, "rejected": {"0.2": 10}}
    )
    assert only_rejected.agreement == 0.7 and only_rejected.coverage == 0.1
    assert (only_rejected.precision, only_rejected.recall, only_rejected.kappa) == (None, None, None)
    assert any("spot_check_approved" in n for n in only_rejected.notes)
    only_approved = calibrate(
        table(9, 1, 0, 0, score=0.9), {"approved": {"0.9": 90}, "rejected": {"0.2": 10}}
    )
    assert only_approved.precision == 0.9 and (only_approved.recall, only_approved.kappa) == (None, None)


def test_held_rows_are_judge_approvals_of_their_own_stratum() -> None:
    """A verdict held for review by its score (review_below_score) counts as an approval, weighed by
    the held rows (all of them on the desk), not by the spot-checked ones."""
    pairs = [Pair(True, False, 0.3, "held")] * 4 + [Pair(True, True, 0.95, "approved", spot_check=True)] * 2
    population = {"held": {"0.3": 4}, "approved": {"0.9": 200}, "rejected": {}}
    doc = calibrate(pairs, population)
    assert doc.spot_checks == 2
    assert doc.precision == round(200 / 204, 4)  # 4 held rows wrong, 200 approved right
    held = next(b for b in doc.buckets if b.bucket == "0.3")
    assert (held.rows, held.judge_approval, held.agreement) == (4, 1.0, 0.0)


def sample(**fields: Any) -> Sample:
    base: dict[str, Any] = dict(
        id="a", shard_id="s", position=0, round=0, attempts=1, prompt=None, output="x", approved=False,
        reason="wrong", score=0.4, group="wrong", record={},
    )  # fmt: skip
    return Sample(**{**base, **fields})


def test_which_rows_and_decisions_make_a_pair() -> None:
    accept = Decision.make(0, "accept", "alice", ids=["a"])
    drop = Decision.make(0, "drop", "alice", ids=["a"])
    bulk = Decision.make(0, "accept", "alice", filter={})
    assert pair_of(sample(), accept) == Pair(False, True, 0.4, "rejected")
    assert pair_of(sample(), drop) == Pair(False, False, 0.4, "rejected")
    assert pair_of(sample(), bulk) is None and pair_of(sample(), None) is None  # a rule, no decision
    spot = sample(
        spot_check=True, judge_approved=True, for_review=True, reason="spot check: ok", group="spot check"
    )
    assert pair_of(spot, drop) == Pair(True, False, 0.4, "approved", spot_check=True)
    # a reward judge's raw score has no tenths: the pair is its verdict's stratum alone
    assert pair_of(sample(score=3.7), accept, tenths=False) == Pair(False, True, None, "rejected")
    assert pair_of(sample(score=3.7), accept).key == ("rejected", "0.9")  # clamped, were it a tenth
    tenths = {t: scored_in_tenths({"type": t}) for t in ("llm", "classifier", "jury", "callable", "reward")}
    assert tenths == {"llm": True, "classifier": True, "jury": True, "callable": True, "reward": False}
    held = sample(judge_approved=True, for_review=True)
    assert judge_verdict(held) == (True, "held")
    assert judge_verdict(sample(judge_approved=False, for_review=True)) == (False, "rejected")
    # rows the judge never judged: no pair
    assert judge_verdict(sample(status="error", reason="inference_error: boom")) is None
    assert judge_verdict(sample(reason="truncated: cut at 256 tokens", group="truncated")) is None
    thinking = "truncated_in_thinking: attempt 1 spent its whole budget thinking"
    assert judge_verdict(sample(reason=thinking, group="truncated_in_thinking")) is None
    assert (
        judge_verdict(sample(for_review=True, reason="awaiting a person's verdict")) is None
    )  # a human judge


def test_pooled_buckets_and_the_plot() -> None:
    a = calibrate(
        table(9, 1, 0, 0, 0.95) + table(0, 0, 1, 9, 0.15), {"approved": {"0.9": 100}, "rejected": {"0.1": 10}}
    )
    b = calibrate(table(3, 1, 0, 0, 0.95), {"approved": {"0.9": 300}}, round=1)
    found = {x.bucket: x for x in pooled([a, b])}
    assert found["0.9"].rows == 400 and found["0.9"].reviewed == 14
    assert found["0.9"].agreement == round((100 * 0.9 + 300 * 0.75) / 400, 4)
    assert found["0.1"].agreement == 0.9
    svg = calibration_chart([a, b])
    assert svg.startswith("<svg") and "kappa" in svg and "per judge score bucket" in svg
    assert svg.count('class="point s0"') == 2  # agreement at both rounds
