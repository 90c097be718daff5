"""The review desk's focus view (page.js) in a real headless Chromium (issue 26 item 5): one sample at
a time from the list (a click, Enter), every shortcut (a, r, d, j / →, k / ←, n, ?, Esc), keys typed
in the note that stay text, the same decision API as the list's (with the note), readable long
texts (JSON, code, show more), a chat prompt per role, the sample's attempts in the earlier round
beside it, hostile model output shown as text, and the light and dark themes (the browser's and
the Airflow UI's); a jury's members (each one's verdict and reason in the focus view and its
attempts, a mark in the list where they split), each attempt's prompt as sent and the reviewer's
note that sent it back; no calibration for a run judged by people.

No live Airflow: the browser's requests to the desk are answered by the api-server's app in process
(the ``desk`` fixture of tests/unit/review/test_focus_app.py: runs ``multi`` and ``jury`` with
rounds 0 and 1 closed, their tail gates open on round 1; run ``people``, judged by people), so the
page and its API are the real ones. One browser for the module.
Screenshots of each view (list, focus, attempts, keys, dark) go to
``$BATCHINFER_TEST_ARTIFACTS/<test>/`` (default ``tests/artifacts/<test>/``)."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.support.browser import Shots, missing

pytest.importorskip("airflow", reason="needs the airflow extra")
if missing():
    pytest.skip(str(missing()), allow_module_level=True)

from playwright.sync_api import Browser, BrowserContext, Page, Route, expect

from tests.support.desk import gate_url
from tests.support.desk_focus import (  # noqa: F401 (desk: the fixture, used by name)
    CODE_OUTPUT,
    HOSTILE,
    JSON_OUTPUT,
    RETRY_SYSTEM,
    ROUND1,
    SENT_BACK,
    SYSTEM,
    desk,
)

pytestmark = [pytest.mark.airflow, pytest.mark.browser, pytest.mark.timeout(300)]
ORIGIN = "http://desk.test"  # never resolved: every request to it is answered by the app in process
DESK = f"{ORIGIN}/batchinfer/review/?dag_id=desk&run_id=multi"
NOTE = "typed: a r d j k n ? and arrows stay text"
expect.set_options(timeout=30_000)


def context(browser: Browser, desk: Any, **options: Any) -> BrowserContext:
    """A context whose requests to ORIGIN go to the desk's app, signed in as alice (who may decide);
    ``/host.html`` is a stand-in for the Airflow UI: a page of the same origin whose <html> carries
    the UI's theme class, the desk in its iframe."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000}, **options)
    ctx.set_default_timeout(30_000)

    def answer(route: Route) -> None:
        req = route.request
        url = urlsplit(req.url)
        if url.path == "/host.html":
            frame = f'<iframe src="{DESK}" width="1200" height="900"></iframe>'
            html = f'<!doctype html><html class="dark"><body>{frame}'
            route.fulfill(status=200, content_type="text/html", body=html)
            return
        path = url.path + ("?" + url.query if url.query else "")
        headers = {"Authorization": f"Bearer {desk.tokens['alice']}", "Content-Type": "application/json"}
        r = desk.client.request(req.method, path, headers=headers, content=req.post_data_buffer)
        route.fulfill(status=r.status_code, headers=dict(r.headers), body=r.content)

    ctx.route(f"{ORIGIN}/**", answer)
    return ctx


def opened(page: Page, desk_url: str = DESK) -> list[str]:
    """The desk's list, browsing round 1 in order; the ids of its rows."""
    page.goto(desk_url)
    expect(page.get_by_test_id("gate-subject")).to_be_visible()
    page.get_by_test_id("browse-button").click()
    expect(page.get_by_test_id("page-info")).to_contain_text(f"{len(ROUND1)} shown")
    expect(page.get_by_test_id("status")).to_have_text("")
    return [r.get_attribute("data-sample-id") or "" for r in page.get_by_test_id("sample-row").all()]


def decisions(desk: Any) -> list[dict[str, Any]]:
    return list(desk.get("bob", gate_url("multi", "/decisions")).json()["decisions"])


def test_the_focus_view_its_keys_and_the_attempts_beside_it(
    browser: Browser,
    desk: Any,
    request: pytest.FixtureRequest,
) -> None:
    shots = Shots(request.node.name)
    ctx = context(browser, desk)
    page = ctx.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    try:
        order = opened(page)
        assert sorted(order) == ROUND1
        root = desk.roots["multi"]
        # titles and headings name the run, its round and DAG, never the run root
        assert page.title() == "Review desk: run · round 1 · desk"
        headings = page.locator("h1, h2, h3").all_inner_texts()
        assert headings and not [h for h in headings if root in h or "/tmp" in h], headings
        expect(page.get_by_test_id("gate-subject")).to_have_text("Round 2: review 16 pending records (run)")
        shots.take(page, "list")

        focus = page.get_by_test_id("focus")
        fid = page.get_by_test_id("focus-id")
        # a click on a row opens it
        page.locator("[data-testid=sample-row][data-sample-id=r01] [data-testid=sample-reason]").click()
        expect(focus).to_be_visible()
        expect(fid).to_have_text("r01")
        expect(page.get_by_test_id("focus-position")).to_have_text(
            f"sample {order.index('r01') + 1} of 16 on page 1"
        )
        expect(page.get_by_test_id("focus-shard")).to_contain_text("part-0000")
        expect(page.get_by_test_id("focus-verdict")).to_have_text("rejected")
        expect(page.get_by_test_id("focus-score")).to_have_text("0.11")
        expect(page.get_by_test_id("focus-reason")).to_have_text(f"unsafe {HOSTILE}")
        # the chat prompt, per role
        messages = page.get_by_test_id("focus-prompt").get_by_test_id("message")
        expect(messages).to_have_count(2)
        assert [m.get_attribute("data-role") for m in messages.all()] == ["system", "user"]
        expect(messages.nth(0)).to_contain_text(SYSTEM)
        expect(messages.nth(1)).to_contain_text("q r01")
        # the attempts: this round's, then round 0's (hostile markup, as text), newest first
        columns = page.get_by_test_id("attempt")
        expect(columns).to_have_count(2)
        assert [c.get_attribute("data-round") for c in columns.all()] == ["1", "0"]
        expect(columns.nth(0).get_by_test_id("attempt-output")).to_have_text("second try at 1")
        expect(columns.nth(1).get_by_test_id("attempt-output")).to_have_text(HOSTILE)
        expect(columns.nth(1).get_by_test_id("attempt-reason")).to_have_text(f"unsafe {HOSTILE}")
        inside = "() => document.querySelectorAll('[data-testid=focus] :is(img, script)').length"
        assert page.evaluate(inside) == 0
        assert page.evaluate("() => [...document.scripts].map(s => new URL(s.src).pathname)") == [
            "/batchinfer/review/static/page.js"
        ]
        shots.take(page, "focus", full_page=False)
        shots.take_element(page.get_by_test_id("focus-attempts"), "attempts")

        # Esc back to the list, the row keeps the keyboard focus; Enter opens it again
        page.keyboard.press("Escape")
        expect(focus).to_be_hidden()
        assert page.evaluate("() => document.activeElement.dataset.sampleId") == "r01"
        page.keyboard.press("Enter")
        expect(fid).to_have_text("r01")

        # j, →, k, ← move through the list's samples
        at = order.index("r01")
        page.keyboard.press("j")
        expect(fid).to_have_text(order[at + 1])
        page.keyboard.press("ArrowRight")
        expect(fid).to_have_text(order[at + 2])
        page.keyboard.press("k")
        expect(fid).to_have_text(order[at + 1])
        page.keyboard.press("ArrowLeft")
        expect(fid).to_have_text("r01")

        # ? shows the keys; Esc hides them (the focus view stays)
        page.keyboard.press("?")
        help_ = page.get_by_test_id("shortcuts")
        expect(help_).to_be_visible()
        expect(help_).to_contain_text("accept this sample")
        shots.take(page, "shortcuts", full_page=False)
        page.keyboard.press("Escape")
        expect(help_).to_be_hidden()
        expect(focus).to_be_visible()

        # readable texts: r02's JSON pretty-printed, r04's code block, r07's long output folded
        for rid in ("r02", "r04", "r07"):
            page.keyboard.press("Escape")
            page.locator(f"[data-testid=sample-row][data-sample-id={rid}] [data-testid=sample-id]").click()
            expect(fid).to_have_text(rid)
            if rid == "r02":
                expect(page.get_by_test_id("focus-output").get_by_test_id("json")).to_have_text(
                    json.dumps(json.loads(JSON_OUTPUT), indent=2)
                )
            elif rid == "r04":
                code = page.get_by_test_id("focus-output").get_by_test_id("code")
                expect(code).to_have_text(CODE_OUTPUT.split("```python\n")[1].split("\n```")[0])
                assert code.evaluate("e => getComputedStyle(e).fontFamily").startswith("SFMono-Regular")
            else:
                toggle = page.get_by_test_id("focus-output").get_by_test_id("toggle-more")
                expect(toggle).to_have_text("show more")
                fold = page.locator("[data-testid=focus-output] .fold")
                folded = fold.evaluate("e => e.getBoundingClientRect().height")
                toggle.click()
                expect(toggle).to_have_text("show less")
                assert fold.evaluate("e => e.getBoundingClientRect().height") > 2 * folded
        page.keyboard.press("Escape")
        page.locator("[data-testid=sample-row][data-sample-id=r01] [data-testid=sample-id]").click()
        expect(fid).to_have_text("r01")

        # n: the note; keys typed there are text (no move, no decision); Esc leaves the field
        assert decisions(desk) == []
        page.keyboard.press("n")
        note = page.get_by_test_id("focus-note")
        expect(note).to_be_focused()
        page.keyboard.type(NOTE)
        page.keyboard.press("ArrowRight")
        expect(note).to_have_value(NOTE)
        expect(fid).to_have_text("r01")
        expect(page.get_by_test_id("shortcuts")).to_be_hidden()
        page.keyboard.press("Escape")
        expect(note).not_to_be_focused()
        expect(focus).to_be_visible()
        assert decisions(desk) == []  # "a", "r", "d" in the note decided nothing

        # d, a, r: one decision each, through the list's API, then on to the next sample
        page.keyboard.press("d")
        expect(page.get_by_test_id("status")).to_have_text("Recorded: Drop r01. 1 decision so far.")
        expect(fid).to_have_text(order[at + 1])
        expect(note).to_have_value("")
        page.keyboard.press("a")
        expect(page.get_by_test_id("status")).to_contain_text(f"Recorded: Accept {order[at + 1]}.")
        page.keyboard.press("r")
        expect(page.get_by_test_id("status")).to_contain_text(f"Recorded: Retry {order[at + 2]}. 3 decisions")
        got = [(d["action"], d["ids"], d["note"], d["by"]) for d in decisions(desk)]
        assert got == [
            ("drop", ["r01"], NOTE, "alice"),
            ("accept", [order[at + 1]], "", "alice"),
            ("retry", [order[at + 2]], "", "alice"),
        ]
        page.keyboard.press("Escape")
        expect(focus).to_be_hidden()
        expect(page.get_by_test_id("decision-row")).to_have_count(3)  # the list's table, reloaded
        expect(page.get_by_test_id("tally-drop")).to_have_text("1 drop")
        assert "decided" in (page.locator("[data-sample-id=r01]").get_attribute("class") or "")
        assert not dialogs  # no alert() ran
    finally:
        ctx.close()


def background(page: Page) -> str:
    return str(page.evaluate("() => getComputedStyle(document.body).backgroundColor"))


def test_light_and_dark_follow_the_browser_and_the_airflow_ui(
    browser: Browser,
    desk: Any,
    request: pytest.FixtureRequest,
) -> None:
    shots = Shots(request.node.name)
    light = context(browser, desk, color_scheme="light")
    dark = context(browser, desk, color_scheme="dark")
    try:
        page = light.new_page()
        opened(page)
        white = background(page)
        assert white == "rgb(255, 255, 255)"
        # the Airflow UI's stored choice (same origin: its "theme" key) wins over the browser's
        page.evaluate("() => localStorage.setItem('theme', 'dark')")
        opened(page)
        assert page.evaluate("() => document.documentElement.dataset.theme") == "dark"
        assert background(page) != white

        page = dark.new_page()
        opened(page)
        assert page.evaluate("() => document.documentElement.dataset.theme") is None  # the browser's
        night = background(page)
        assert night != white
        shots.take(page, "dark-list")
        page.locator("[data-testid=sample-row][data-sample-id=r01] [data-testid=sample-reason]").click()
        expect(page.get_by_test_id("attempt")).to_have_count(2)
        shots.take(page, "dark-focus", full_page=False)
        page.evaluate("() => localStorage.setItem('theme', 'light')")
        opened(page)
        assert background(page) == white

        # inside the Airflow UI (its iframe): the UI's <html> class, followed when it changes
        page = dark.new_page()
        page.goto(f"{ORIGIN}/host.html")
        frame = page.frame_locator("iframe")
        expect(frame.get_by_test_id("gate-subject")).to_be_visible()
        inner = next(f for f in page.frames if "/batchinfer/review/" in f.url)
        assert inner.evaluate("() => document.documentElement.dataset.theme") == "dark"
        page.evaluate("() => document.documentElement.className = 'light'")
        page.wait_for_function(
            "() => document.querySelector('iframe').contentDocument.documentElement.dataset.theme === 'light'"
        )
        assert inner.evaluate("() => getComputedStyle(document.body).backgroundColor") == white
    finally:
        light.close()
        dark.close()


JURY_DESK = f"{ORIGIN}/batchinfer/review/?dag_id=desk&run_id=jury"
MEMBERS = ["critic", "long-enough", "digits"]


def test_a_jurys_members_and_what_each_attempt_was_sent(
    browser: Browser,
    desk: Any,
    request: pytest.FixtureRequest,
) -> None:
    shots = Shots(request.node.name)
    ctx = context(browser, desk, color_scheme="light")
    page = ctx.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    try:
        order = opened(page, JURY_DESK)
        assert sorted(order) == ROUND1
        # the list marks the samples whose members split (the critic approved the even ids)
        split = [rid for rid in order if int(rid[1:]) % 2 == 0]
        marks = page.get_by_test_id("jury-split")
        expect(marks).to_have_count(len(split))
        row = page.locator("[data-testid=sample-row][data-sample-id=r02]")
        expect(row.get_by_test_id("jury-split")).to_have_text("jury 1 of 3")
        title = row.get_by_test_id("jury-split").get_attribute("title")
        assert title == "the jury split: critic approved, long-enough rejected, digits rejected"
        expect(
            page.locator("[data-testid=sample-row][data-sample-id=r01] [data-testid=jury-split]")
        ).to_have_count(0)
        shots.take(page, "jury-list")

        # r02's focus view: the members' verdicts and reasons under the jury's reason
        row.get_by_test_id("sample-reason").click()
        expect(page.get_by_test_id("focus-id")).to_have_text("r02")
        expect(page.get_by_test_id("focus-reason")).to_have_text(
            "majority: 1 of 3 approve (approved by critic)"
        )
        members = page.get_by_test_id("focus-members").get_by_test_id("member")
        expect(members).to_have_count(3)
        assert [m.get_attribute("data-member") for m in members.all()] == MEMBERS
        expect(members.get_by_test_id("member-verdict")).to_have_text(["approved", "rejected", "rejected"])
        expect(members.nth(0).get_by_test_id("member-score")).to_have_text("score 0.42")
        expect(members.nth(0).get_by_test_id("member-reason")).to_have_text(
            "critic, round 1: still wrong: expected 2"
        )
        expect(members.nth(2).get_by_test_id("member-reason")).to_have_text("no digits")
        expect(members.nth(1).get_by_test_id("member-score")).to_have_count(0)  # a rule gives no score

        # its attempts: round 1's prompt the retry template under the retry system message (told round
        # 0's answer, the jury's reason and the reviewer's empty note: no Reviewer line), round 0's the
        # run's; round 0's column says who sent it back; each with the members' verdicts
        columns = page.get_by_test_id("attempt")
        expect(columns).to_have_count(2)
        now, before = columns.nth(0), columns.nth(1)
        prompt_now = now.get_by_test_id("attempt-prompt").get_by_test_id("message")
        expect(prompt_now).to_have_count(2)
        expect(prompt_now.nth(0)).to_contain_text(RETRY_SYSTEM)
        expect(prompt_now.nth(1)).to_contain_text(
            f"q r02\nLast time: {JSON_OUTPUT}\nJudge: majority: 1 of 3 approve"
        )
        expect(prompt_now.nth(1)).not_to_contain_text("Reviewer:")
        prompt_before = before.get_by_test_id("attempt-prompt").get_by_test_id("message")
        expect(prompt_before.nth(0)).to_contain_text(SYSTEM)
        expect(prompt_before.nth(1)).to_have_text("userq r02")
        expect(now.get_by_test_id("attempt-sent-back")).to_have_count(0)  # not decided yet
        sent = before.get_by_test_id("attempt-sent-back")
        expect(sent).to_contain_text("sent back by ann at ")
        expect(sent).to_contain_text("(no note)")
        for column in (now, before):
            expect(column.get_by_test_id("attempt-members").get_by_test_id("member")).to_have_count(3)
        expect(before.get_by_test_id("member-reason").first).to_have_text("critic, round 0: wrong answer (2)")

        # r01: sent back with a note, which its next prompt read; hostile markup in it stays text
        page.keyboard.press("Escape")
        page.locator("[data-testid=sample-row][data-sample-id=r01] [data-testid=sample-id]").click()
        expect(page.get_by_test_id("focus-id")).to_have_text("r01")
        expect(columns).to_have_count(2)
        note = SENT_BACK["r01"]
        expect(columns.nth(1).get_by_test_id("sent-back-note")).to_have_text(note)
        expect(columns.nth(0).get_by_test_id("attempt-prompt")).to_contain_text(f"Reviewer: {note}")
        expect(columns.nth(0).get_by_test_id("attempt-prompt")).to_contain_text(f"Last time: {HOSTILE}")
        assert (
            page.evaluate("() => document.querySelectorAll('[data-testid=focus] :is(img, script)').length")
            == 0
        )
        shots.take(page, "jury-focus", full_page=False)
        shots.take_element(page.get_by_test_id("focus-attempts"), "jury-attempts")

        # r07: its retry prompt holds round 0's long answer: folded in its column, unfolded on demand
        page.keyboard.press("Escape")
        page.locator("[data-testid=sample-row][data-sample-id=r07] [data-testid=sample-id]").click()
        expect(page.get_by_test_id("focus-id")).to_have_text("r07")
        asked = columns.nth(0).get_by_test_id("attempt-prompt")
        toggle = asked.get_by_test_id("toggle-more")
        expect(toggle).to_have_count(1)
        fold = asked.locator(".fold").last
        folded = fold.evaluate("e => e.getBoundingClientRect().height")
        toggle.click()
        expect(toggle).to_have_text("show less")
        assert fold.evaluate("e => e.getBoundingClientRect().height") > 2 * folded
        expect(columns.nth(1).get_by_test_id("attempt-prompt").get_by_test_id("toggle-more")).to_have_count(0)
        assert not dialogs
    finally:
        ctx.close()

    dark = context(browser, desk, color_scheme="dark")
    try:
        page = dark.new_page()
        opened(page, JURY_DESK)
        assert background(page) != "rgb(255, 255, 255)"
        page.locator("[data-testid=sample-row][data-sample-id=r02] [data-testid=sample-reason]").click()
        expect(page.get_by_test_id("focus-members").get_by_test_id("member")).to_have_count(3)
        expect(page.get_by_test_id("attempt")).to_have_count(2)
        shots.take(page, "dark-jury-focus", full_page=False)
        shots.take_element(page.get_by_test_id("focus-attempts"), "dark-jury-attempts")
    finally:
        dark.close()


def test_no_calibration_for_a_run_judged_by_people(
    browser: Browser,
    desk: Any,
    request: pytest.FixtureRequest,
) -> None:
    shots = Shots(request.node.name)
    ctx = context(browser, desk)
    page = ctx.new_page()
    try:
        opened(page)
        expect(page.get_by_test_id("calibration")).to_be_visible()  # a judge to check: shown
        page.goto(f"{ORIGIN}/batchinfer/review/?dag_id=desk&run_id=people")
        expect(page.get_by_test_id("gate-round")).to_have_text("0")
        expect(page.get_by_test_id("sample-row").first).to_be_visible()
        expect(page.get_by_test_id("status")).to_have_text("")
        expect(page.get_by_test_id("calibration")).to_have_count(0)
        shots.take(page, "people-judge")
    finally:
        ctx.close()
