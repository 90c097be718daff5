"""The judge checked against people on the review desk, in Airflow's own api-server app at the seams of
test_app.py: a run whose judge is known to be wrong on a share of the rows
(:mod:`airflow_batchinfer.dev.calibration`)
holds back spot checks of its approvals; the desk lists them beside
the rejected rows (their reason group, a flag on each sample), a scripted reviewer who knows the truth
decides on the desk's HTTP API, the desk's live figures follow every decision, and once the gate is
answered they are the ones stored and shown. The ``calibration_desk`` fixture is the browser test's
too (tests/component/review/test_desk_calibration_browser.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("airflow", reason="needs the airflow extra")
pytestmark = pytest.mark.airflow

from airflow_batchinfer.dev import calibration as c  # noqa: E402
from airflow_batchinfer.run.plan import CONTINUE  # noqa: E402
from airflow_batchinfer.state.docs import read_summary  # noqa: E402
from airflow_batchinfer.state.docs.calibration import read_calibration  # noqa: E402
from airflow_batchinfer.state.layout import RunLayout  # noqa: E402
from tests.support.desk import answer_gate  # noqa: E402
from tests.support.desk_calibration import (  # noqa: E402
    RUN,
    CalibrationDesk,
    calibration_desk,  # noqa: F401 (a fixture, used by name)
)
from tests.support.spot_checks import run_slot  # noqa: E402


def test_spot_checks_are_on_the_desk_beside_the_rejected_rows(calibration_desk: CalibrationDesk) -> None:
    d, cfg = calibration_desk.desk, calibration_desk.cfg
    summary = read_summary(RunLayout(cfg.run_root), 0)
    assert summary is not None and summary.spot_checks
    body = d.get("bob", calibration_desk.url("/summary")).json()
    assert body["counts"]["spot_checks"] == summary.spot_checks
    assert {"group": "spot check", "count": summary.spot_checks} in body["groups"]
    page = d.get("bob", calibration_desk.url("/page"), params={"group": "spot check", "size": 200}).json()
    assert page["total"] == summary.spot_checks == len(page["samples"])
    assert all(s["spot_check"] and s["judge_approved"] and s["for_review"] for s in page["samples"])
    assert all(s["reason"] == "spot check: looks right" for s in page["samples"])
    other = d.get("bob", calibration_desk.url("/page"), params={"group": "looks wrong", "size": 5}).json()
    assert not any(s["spot_check"] for s in other["samples"])
    tally = d.get("bob", calibration_desk.url("/decisions")).json()["tally"]
    assert tally["approve"] == summary.spot_checks  # undecided, they follow the judge


def test_live_figures_follow_the_decisions_and_are_the_ones_stored_at_the_answer(
    calibration_desk: CalibrationDesk,
) -> None:
    d, cfg = calibration_desk.desk, calibration_desk.cfg
    layout = RunLayout(cfg.run_root)
    before = d.get("bob", calibration_desk.url("/calibration")).json()
    assert before["live"] and before["round"] == 0 and before["calibration"]["reviewed"] == 0
    assert before["calibration"]["notes"]  # nothing reviewed yet: says so
    decided = c.review_on_desk(d, RUN, user="carol")  # the scripted reviewer, over HTTP
    live = d.get("bob", calibration_desk.url("/calibration")).json()
    figures = live["calibration"]
    assert figures["reviewed"] == decided["accept"] + decided["retry"] and figures["spot_checks"] > 30
    # every verdict reviewed (a score bucket of the approvals the sample missed lends its rows)
    assert figures["weighted"] and figures["coverage"] > 0.9
    assert not [n for n in figures["notes"] if "was reviewed" in n or "undefined" in n]
    # every judged row of the round was reviewed but the approvals, sampled (about 75: the sample is
    # the run's): within about 4 standard errors of the construction's figures
    want = c.expected((f"c{i:05d}", 1) for i in range(600))
    assert abs(figures["agreement"] - want.agreement) < 0.1 and abs(figures["kappa"] - want.kappa) < 0.25
    svg = d.get("bob", calibration_desk.url("/calibration.svg"))
    assert svg.status_code == 200 and svg.headers["content-type"].startswith("image/svg+xml")
    assert "judge vs reviewers" in svg.text

    # the gate is answered: the decisions are applied and the figures stored are the live ones
    answer_gate(RUN, "round_01.plan", CONTINUE)
    plan = run_slot(cfg, "round-01", CONTINUE)
    assert plan.reviewed is not None and plan.reviewed.counts["accept"] == decided["accept"]
    stored = read_calibration(layout, 0)
    assert stored is not None
    assert {**stored.to_json(), "bulk": None} == {**figures, "bulk": None}
    after = d.get("bob", calibration_desk.url("/calibration")).json()
    assert not after["live"] and after["calibration"] == stored.to_json()


def test_reading_the_figures_needs_the_dags_read_permission(calibration_desk: CalibrationDesk) -> None:
    d = calibration_desk.desk
    assert d.get(None, calibration_desk.url("/calibration")).status_code == 401
    assert d.get("bob", calibration_desk.url("/calibration"), params={"round": 5}).status_code == 404
