"""The review desk's spot checks and calibration (issue 26 item 2) in a real headless Chromium: the
spot checks' reason group first among the reasons, a badge on each spot-checked sample in the list
and in the focus view (with what Accept, Retry and Drop mean for it), a decision from the focus view
moving the live figures (agreement, Cohen's kappa, precision, recall, per score bucket, the plot),
then the figures after a scripted reviewer decided the rest; light and dark.

No live Airflow: the browser's requests to the desk are answered by the api-server's app in process
(the ``calibration_desk`` fixture of tests/support/desk_calibration.py: a run whose judge is
known to be wrong on a share of the rows, round 0 closed with spot checks, its gate open), so the
page and its API are the real ones. Screenshots go to ``$BATCHINFER_TEST_ARTIFACTS/<test>/``
(default ``tests/artifacts/<test>/``)."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.support.browser import Shots, missing

pytest.importorskip("airflow", reason="needs the airflow extra")
if missing():
    pytest.skip(str(missing()), allow_module_level=True)

from playwright.sync_api import Browser, BrowserContext, Route, expect

from airflow_batchinfer.dev import calibration as c
from tests.support.desk_calibration import RUN, CalibrationDesk, calibration_desk  # noqa: F401

pytestmark = [pytest.mark.airflow, pytest.mark.browser, pytest.mark.timeout(300)]
ORIGIN = "http://desk.test"  # never resolved: every request to it is answered by the app in process
DESK = f"{ORIGIN}/batchinfer/review/?dag_id=desk&run_id={RUN}"
expect.set_options(timeout=30_000)


def to_fixed(value: float, digits: int) -> str:
    """``value.toFixed(digits)`` as the page's JavaScript writes it: a tie rounds away from zero
    (Python's format rounds it to even: 78.25 is "78.2" there, "78.3" on the page)."""
    exact = Decimal(value).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP)
    return f"{exact:.{digits}f}"


def context(browser: Browser, cd: CalibrationDesk, **options: Any) -> BrowserContext:
    """A context whose requests to ORIGIN go to the desk's app, signed in as alice (who may decide)."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000}, **options)
    ctx.set_default_timeout(30_000)

    def answer(route: Route) -> None:
        req = route.request
        url = urlsplit(req.url)
        path = url.path + ("?" + url.query if url.query else "")
        headers = {"Authorization": f"Bearer {cd.desk.tokens['alice']}", "Content-Type": "application/json"}
        r = cd.desk.client.request(req.method, path, headers=headers, content=req.post_data_buffer)
        route.fulfill(status=r.status_code, headers=dict(r.headers), body=r.content)

    ctx.route(f"{ORIGIN}/**", answer)
    return ctx


def test_spot_checks_beside_the_rejected_ones_and_the_live_calibration(
    calibration_desk: CalibrationDesk,
    browser: Browser,
    request: pytest.FixtureRequest,
) -> None:
    shots = Shots(request.node.name)
    cd = calibration_desk
    spots = cd.desk.get("bob", cd.url("/summary")).json()["counts"]["spot_checks"]
    ctx = context(browser, cd, color_scheme="light")
    page = ctx.new_page()
    try:
        page.goto(DESK)
        expect(page.get_by_test_id("gate-subject")).to_be_visible()
        # the reasons: the spot checks first, then the judge's rejections
        groups = page.get_by_test_id("groups").locator("button")
        expect(groups.nth(1)).to_have_attribute("data-testid", "group-spot-check")
        expect(groups.nth(1)).to_have_text(f"spot checks (judge approved) {spots}")
        # nothing decided yet: the section says what it needs
        section = page.get_by_test_id("calibration")
        expect(page.get_by_test_id("calib-reviewed")).to_contain_text("0 reviewed")
        notes = page.get_by_test_id("calibration-notes")
        expect(notes).to_contain_text("no reviewed row")
        expect(page.get_by_test_id("tally-approve")).to_have_text(
            f"{spots} approved as judged (undecided spot checks)"
        )

        # the list of spot checks: each one badged, its verdict the judge's
        page.get_by_test_id("group-spot-check").click()
        expect(page.get_by_test_id("filter")).to_have_text("Filter: reason group “spot check”")
        rows = page.get_by_test_id("sample-row")
        shown = min(spots, 50)  # a page of 50
        expect(rows).to_have_count(shown)
        expect(page.get_by_test_id("spot-check-badge")).to_have_count(shown)
        expect(rows.first.get_by_test_id("sample-verdict")).to_have_text("approved spot check")
        shots.take(page, "spot-checks-list")

        # the focus view: the badge, what the actions mean; a decides (one by its id: counted)
        first = rows.first.get_attribute("data-sample-id") or ""
        rows.first.get_by_test_id("sample-reason").click()
        expect(page.get_by_test_id("focus-id")).to_have_text(first)
        expect(page.get_by_test_id("focus-verdict")).to_have_text("approved")
        expect(page.get_by_test_id("focus-spot-check")).to_have_text("spot check")
        expect(page.get_by_test_id("focus-spot-hint")).to_contain_text("Undecided, it goes to the results")
        shots.take(page, "spot-check-focus", full_page=False)
        right = c.truth(first, 1)
        page.keyboard.press("a" if right else "d")
        expect(page.get_by_test_id("status")).to_contain_text(
            f"Recorded: {'Accept' if right else 'Drop'} {first}."
        )
        page.keyboard.press("Escape")
        expect(page.get_by_test_id("calib-reviewed")).to_contain_text("1 reviewed (1 spot checks), live")
        expect(page.get_by_test_id("tally-approve")).to_contain_text(str(spots - 1))
        # one approval checked, no rejection yet: the figures that need both say why they are missing
        expect(notes).to_contain_text("no row the judge rejected was reviewed")

        # the scripted reviewer decides the rest on the desk's API; the page shows the round's figures
        decided = c.review_on_desk(cd.desk, RUN, user="carol")
        page.get_by_test_id("group-all").click()
        page.reload()
        reviewed = decided["accept"] + decided["retry"]
        expect(page.get_by_test_id("calib-reviewed")).to_contain_text(f"{reviewed} reviewed")
        live = cd.desk.get("bob", cd.url("/calibration")).json()["calibration"]
        assert live["kappa"] is not None and live["reviewed"] == reviewed
        for name in ("agreement", "precision", "recall"):
            expect(page.get_by_test_id(f"calib-{name}").locator("b")).to_have_text(
                f"{to_fixed(live[name] * 100, 1)}%"
            )
        expect(page.get_by_test_id("calib-kappa").locator("b")).to_have_text(to_fixed(live["kappa"], 3))
        buckets = page.get_by_test_id("calibration-bucket")
        expect(buckets).to_have_count(len(live["buckets"]))
        low, high = buckets.first.locator("td"), buckets.last.locator("td")
        assert low.nth(0).inner_text() == "0.0" and high.nth(0).inner_text() == "0.9"
        # the construction: the judge errs most at low scores, never at the top
        assert float(low.nth(5).inner_text().rstrip("%")) < float(high.nth(5).inner_text().rstrip("%"))
        plot = page.get_by_test_id("calibration-plot")
        page.wait_for_function(
            "() => { const i = document.querySelector('[data-testid=calibration-plot]');"
            " return i && i.complete && i.naturalWidth > 0 }"
        )
        assert plot.evaluate("e => e.naturalWidth") > 400
        shots.take_element(section, "calibration")
        shots.take(page, "desk-with-calibration")
    finally:
        ctx.close()

    dark = context(browser, cd, color_scheme="dark")
    try:
        page = dark.new_page()
        page.goto(DESK)
        expect(page.get_by_test_id("calib-kappa")).to_be_visible()
        assert page.evaluate("() => getComputedStyle(document.body).backgroundColor") != "rgb(255, 255, 255)"
        page.get_by_test_id("group-spot-check").click()
        expect(page.get_by_test_id("spot-check-badge").first).to_be_visible()
        shots.take_element(page.get_by_test_id("calibration"), "dark-calibration")
        page.get_by_test_id("sample-row").first.get_by_test_id("sample-reason").click()
        expect(page.get_by_test_id("focus-spot-check")).to_be_visible()
        shots.take(page, "dark-spot-check-focus", full_page=False)
    finally:
        dark.close()
