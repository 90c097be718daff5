"""The review desk's Shards view (page.js) in a real headless Chromium (issue 24 item 2): a round run
by lanes shows every shard's state, lane, records and error, filtered by state; a round under way
shows its running, claimed and never-claimed shards.

No live Airflow: the browser's requests to the desk are answered by the api-server's app in process
(the ``desk`` fixture of tests/unit/review/test_shards_app.py: round 0 run by the real lane loop and
closed, round 1 under way), so the page and its API are the real ones. Screenshots go to
``$BATCHINFER_TEST_ARTIFACTS/<test>/`` (default ``tests/artifacts/<test>/``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.support.browser import Shots, missing

pytest.importorskip("airflow", reason="needs the airflow extra")
if missing():
    pytest.skip(str(missing()), allow_module_level=True)

from playwright.sync_api import Browser, Page, Route, expect

from tests.support.desk_shards import FAILING, desk  # noqa: F401 (desk: the fixture, used by name)
from tests.support.lane_rounds import BROKEN

pytestmark = [pytest.mark.airflow, pytest.mark.browser, pytest.mark.timeout(300)]
ORIGIN = "http://desk.test"  # never resolved: every request to it is answered by the app in process


@pytest.fixture
def page(browser: Browser, desk: Any) -> Iterator[Page]:
    """A page whose requests to ORIGIN go to the desk's app, signed in as bob (a viewer)."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    ctx.set_default_timeout(60_000)

    def answer(route: Route) -> None:
        url = urlsplit(route.request.url)
        r = desk.get("bob", url.path + ("?" + url.query if url.query else ""))
        route.fulfill(status=r.status_code, headers=dict(r.headers), body=r.content)

    ctx.route(f"{ORIGIN}/**", answer)
    try:
        yield ctx.new_page()
    finally:
        ctx.close()


def test_the_shards_view_shows_each_shard_and_filters_by_state(
    page: Page, request: pytest.FixtureRequest
) -> None:
    shots = Shots(request.node.name)
    page.goto(f"{ORIGIN}/batchinfer/review/?dag_id=desk&run_id=lanes")
    section = page.get_by_test_id("shards-section")
    rows = section.get_by_test_id("shard-row")
    expect(rows).to_have_count(10)
    expect(section.get_by_test_id("shard-count-shards")).to_have_text("10 shards")
    expect(section.get_by_test_id("shard-count-lanes")).to_have_text("3 lanes")
    expect(section.get_by_test_id("shard-count-done")).to_have_text("9 done")
    expect(section.get_by_test_id("shard-count-failed")).to_have_text("1 failed")
    expect(section.get_by_test_id("shard-count-unclaimed")).to_have_text("0 never claimed")
    failed = section.locator(f"[data-testid=shard-row][data-shard-id={FAILING}]")
    expect(failed.get_by_test_id("shard-state")).to_have_text("failed")
    expect(failed.get_by_test_id("shard-error")).to_contain_text(BROKEN)
    expect(failed.get_by_test_id("shard-quarantine")).to_contain_text(f"round-00/failed/{FAILING}.json")
    expect(failed.get_by_test_id("shard-records")).to_have_text("3")
    section.scroll_into_view_if_needed()
    shots.take(page, "round-0-all-shards")

    section.get_by_test_id("shards-state").select_option("failed")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-shard-id", FAILING)
    expect(section.get_by_test_id("shards-info")).to_have_text("page 1: 1 of 1 shards")
    shots.take(page, "round-0-failed-only")

    section.get_by_test_id("shards-state").select_option("")
    expect(rows).to_have_count(10)
    expect(page.get_by_test_id("status")).to_have_text("")  # no error


def test_a_round_under_way_shows_running_claimed_and_never_claimed(
    page: Page, request: pytest.FixtureRequest
) -> None:
    page.goto(f"{ORIGIN}/batchinfer/review/?dag_id=desk&run_id=moving")
    section = page.get_by_test_id("shards-section")
    rows = section.get_by_test_id("shard-row")
    expect(rows).to_have_count(10)  # the gate's round first
    section.get_by_test_id("shards-round").select_option("1")
    expect(rows).to_have_count(5)
    expect(section.get_by_test_id("shard-state")).to_have_text(
        ["done", "claimed", "running", "never claimed", "never claimed"]
    )
    expect(section.get_by_test_id("shards-info")).to_contain_text("the round has not closed")
    section.get_by_test_id("shards-state").select_option("unfinished")
    expect(section.get_by_test_id("shard-state")).to_have_text(["claimed", "running"])
    section.scroll_into_view_if_needed()
    Shots(request.node.name).take(page, "round-1-unfinished")
    expect(page.get_by_test_id("status")).to_have_text("")


def test_shards_it_cannot_read_are_said_in_their_section_and_the_desk_goes_on(page: Page) -> None:
    page.goto(f"{ORIGIN}/batchinfer/review/?dag_id=desk&run_id=broken")
    section = page.get_by_test_id("shards-section")
    expect(section.get_by_test_id("shard-row")).to_have_count(10)
    section.get_by_test_id("shards-round").select_option("1")
    info = section.get_by_test_id("shards-info")
    expect(info).to_contain_text("Shards: StorageError:")
    expect(info).to_contain_text("lane-0001.json")
    expect(info).to_have_class("page-info error")
    expect(page.get_by_test_id("sample-row").first).to_be_visible()  # the samples still show
    expect(page.get_by_test_id("status")).to_have_text("")
