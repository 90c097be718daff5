"""The review desk's page (page.js) in a real headless Chromium with a sample whose texts the desk cut
(issue 22, item 5): the page says "truncated, N bytes" and its **show all** loads the whole value.

No live Airflow: the browser's requests to the desk are answered by the api-server's app in process
(the ``desk`` fixture of tests/unit/review/test_desk_bounded.py: a round with a 4 MiB output and a
4 MiB record field), so the page, its API and the field endpoint are the real ones. A screenshot
goes to ``$BATCHINFER_TEST_ARTIFACTS/<test>/`` (default ``tests/artifacts/<test>/``)."""

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

from tests.support.desk_bounded import OUTPUT, desk  # noqa: F401 (desk: the fixture, used by name)

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


def test_a_cut_output_says_so_and_show_all_loads_it_whole(page: Page, request: pytest.FixtureRequest) -> None:
    page.goto(f"{ORIGIN}/batchinfer/review/?dag_id=desk&run_id=huge")
    row = page.locator("[data-testid=sample-row][data-sample-id=r01]")
    output = row.get_by_test_id("sample-output")
    expect(output).to_have_text(OUTPUT[: 16 * 1024])
    cut = row.locator("[data-testid=sample-output] + .cut [data-testid=truncated]")
    expect(cut).to_have_text("truncated, 4,194,304 bytes")
    expect(row.locator("[data-testid=sample-prompt] + .cut [data-testid=truncated]")).to_contain_text(
        "900,000"
    )
    row.scroll_into_view_if_needed()
    Shots(request.node.name).take(page, "truncated", full_page=False)
    row.locator("[data-testid=sample-output] + .cut [data-testid=show-all]").click()
    expect(cut).to_have_text("whole, 4,194,304 bytes")
    assert output.evaluate("e => e.textContent.length") == len(OUTPUT)
    assert output.evaluate("e => e.textContent.endsWith('<end>')")
    expect(page.get_by_test_id("status")).to_have_text("")  # no error
