"""The review desk's page (page.js) in a real headless Chromium with samples whose prompts hold images:
the focus view shows a thumbnail of each image inside the record (a data: URL), loaded from the desk's
image endpoint and scaled down, and none of an image named by a path (its prompt line says where).

No live Airflow: the browser's requests are answered by the api-server's app in process (the
``images_desk`` fixture of tests/support/desk_images.py). A screenshot goes to
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

from tests.support.desk_images import images_desk  # noqa: F401 (the fixture, used by name)

pytestmark = [pytest.mark.airflow, pytest.mark.browser, pytest.mark.timeout(300)]
ORIGIN = "http://desk.test"  # never resolved: every request to it is answered by the app in process


@pytest.fixture
def page(browser: Browser, images_desk: Any) -> Iterator[Page]:
    """A page whose requests to ORIGIN go to the desk's app, signed in as bob (a viewer); the image
    requests it makes are kept in ``page.images``."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    ctx.set_default_timeout(60_000)
    asked: list[str] = []

    def answer(route: Route) -> None:
        url = urlsplit(route.request.url)
        if url.path.endswith("/image"):
            asked.append(url.query)
        r = images_desk.get("bob", url.path + ("?" + url.query if url.query else ""))
        route.fulfill(status=r.status_code, headers=dict(r.headers), body=r.content)

    ctx.route(f"{ORIGIN}/**", answer)
    try:
        p = ctx.new_page()
        p.images = asked  # type: ignore[attr-defined]
        yield p
    finally:
        ctx.close()


def test_the_focus_view_shows_a_thumbnail_of_each_image_in_the_record(
    page: Page, request: pytest.FixtureRequest
) -> None:
    page.goto(f"{ORIGIN}/batchinfer/review/?dag_id=desk&run_id=images")
    row = page.get_by_test_id("sample-row").first
    expect(row.get_by_test_id("sample-prompt")).to_contain_text("[image 2: s3://b/cats/1.png]")
    assert page.images == []  # type: ignore[attr-defined]  # the list loads no image
    row.get_by_test_id("sample-reason").click()
    thumbs = page.get_by_test_id("focus").get_by_test_id("thumb")
    expect(thumbs).to_have_count(2)  # images 1 and 3: image 2 is named by a path
    assert [t.get_attribute("alt") for t in thumbs.all()] == ["image 1", "image 3"]
    page.wait_for_function(
        "() => [...document.querySelectorAll('[data-testid=thumb]')].every(i => i.complete && i.naturalWidth)"
    )
    sizes = [t.evaluate("i => [i.naturalWidth, i.naturalHeight, i.width, i.height]") for t in thumbs.all()]
    assert sizes[0] == [30, 20, 30, 20]
    assert sizes[1][:2] == [160, 160] and max(sizes[1][2:]) <= 160  # scaled down by the CSS
    assert {q.split("index=")[1].split("&")[0] for q in page.images} == {"1", "3"}  # type: ignore[attr-defined]
    Shots(request.node.name).take(page, "thumbnails", full_page=False)
    expect(page.get_by_test_id("status")).to_have_text("")  # no error
