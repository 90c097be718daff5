"""The Airflow UI and the review desk in a real browser (headless Chromium from the system's package,
driven by Playwright) on a real Airflow 3.3.2 (the e2e ``airflow`` fixture), with the DAGs of
tests/system/e2e/dags/e2e_browser_*.py: the trigger form, a reviewer's decisions and the gate's
answer with a changed temperature, people as the judge, and hostile model output shown as text.

Screenshots of every step go to ``$BATCHINFER_TEST_ARTIFACTS/<test>/`` (default
``tests/artifacts/<test>/``); their paths are printed (``pytest -s`` shows them).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import pytest

from tests.support.browser import REPO, EchoServer, Shots, chromium, missing, sign_in

pytest.importorskip("airflow", reason="needs the airflow extra")
if missing():
    pytest.skip(str(missing()), allow_module_level=True)

from playwright.sync_api import Browser, BrowserContext, FrameLocator, Page, Route, expect

from airflow_batchinfer.dev.local_airflow import LocalAirflow
from airflow_batchinfer.spec.settings import ADVANCED, SECTIONS
from airflow_batchinfer.storage import JsonlFile

pytestmark = [pytest.mark.airflow, pytest.mark.slow, pytest.mark.browser, pytest.mark.timeout(600)]

DAGS = ("e2e_browser_trigger", "e2e_browser_review", "e2e_browser_people", "e2e_browser_echo")
POOLS = ("e2e-browser", "e2e-browser-echo")  # the local worker pools of those DAGs
HOSTILE = "<script>alert(1)</script> ![x](http://evil.example/p.png)"
NOTE = "no answer at all: the engine failed on it"
# Airflow 3.3.2 can fail a gate answered within seconds of its opening (see LocalAirflow.wait_run)
REVIEW_DELAY_S = 12
expect.set_options(timeout=60_000)
KNOBS = ("chunk_size", "lanes", "unreachable_grace_s", "max_id_bytes")  # in the trigger form's Advanced


@dataclass
class Runs:
    """The DAG runs the review tests work on, triggered before the first test (their gates open while
    the trigger form's run runs)."""

    root: Path  # the DAGs' output_root
    review: str
    people: str
    echo: str
    echo_server: EchoServer

    def run_root(self, name: str) -> Path:
        return self.root / name


def arithmetic(path: Path, n: int, *, fail_every: int = 0) -> list[str]:
    """``n`` questions "What is a + b?" with their answers; every ``fail_every``-th holds the
    SIMULATED engine's fail_marker (an inference error)."""
    ids = [f"q{i:02d}" for i in range(n)]
    with path.open("w") as f:
        for i, rid in enumerate(ids):
            a, b = i % 7 + 1, i % 5 + 2
            fail = "FAIL " if fail_every and i % fail_every == 0 else ""
            f.write(json.dumps({"id": rid, "question": f"{fail}What is {a} + {b}?", "answer": a + b}) + "\n")
    return ids


@pytest.fixture(scope="module")
def runs(airflow: LocalAirflow, e2e_root: Path) -> Iterator[Runs]:
    from airflow_batchinfer.pools import LocalPool

    for dag_id in DAGS:
        airflow.wait_for_dag(dag_id)
    data = e2e_root / "browser"  # the DAGs' defaults read their datasets here
    data.mkdir(exist_ok=True)
    arithmetic(data / "trigger.jsonl", 30)
    arithmetic(data / "review.jsonl", 40, fail_every=5)
    arithmetic(data / "people.jsonl", 30)
    with (data / "echo.jsonl").open("w") as f:
        for i, question in enumerate([HOSTILE, *(f"short {i}" for i in range(1, 8))]):
            f.write(json.dumps({"id": f"e{i:02d}", "question": question}) + "\n")
    try:
        with EchoServer() as echo:
            opts = {"base_url": echo.base_url, "max_retries": 0}
            # One cold pool start at a time, the other runs after: on two cores, a pool_setup task
            # deferring while many tasks start can meet an Airflow 3.3.2 race (the scheduler sees the
            # deferral's "success" after the trigger fired, and fails the task). The trigger form's
            # run and the people's run find their pool warm (no deferral).
            yield Runs(
                data / "runs",
                echo=started(airflow, "e2e_browser_echo", {"run_name": "echo", "engine_options": opts}),
                review=started(airflow, "e2e_browser_review", {"run_name": "review"}),
                people=started(airflow, "e2e_browser_people", {"run_name": "people"}, wait=False),
                echo_server=echo,
            )
    finally:
        for name in POOLS:
            LocalPool(name, state_dir=e2e_root / "cache" / "pools").down()


def started(af: LocalAirflow, dag_id: str, conf: dict[str, Any], *, wait: bool = True) -> str:
    """Trigger a run; with ``wait``, return once its pool is up (its pool_setup task succeeded)."""
    run_id = af.trigger(dag_id, conf)
    deadline = time.monotonic() + 120
    while wait:
        states = {ti["task_id"]: ti["state"] for ti in af.task_instances(dag_id, run_id)}
        if states.get("pool_setup") == "success":
            break
        assert states.get("pool_setup") not in ("failed", "upstream_failed"), broken(af, dag_id, run_id)
        assert time.monotonic() < deadline, f"{dag_id}/{run_id}: pool_setup still {states.get('pool_setup')}"
        time.sleep(0.5)
    return run_id


def broken(af: LocalAirflow, dag_id: str, run_id: str) -> str:
    failed = [ti["task_id"] for ti in af.task_instances(dag_id, run_id) if ti["state"] == "failed"]
    return f"{dag_id}/{run_id}: failed tasks {failed}; logs under {af.home / 'logs'}"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    ctx.set_default_timeout(60_000)
    try:
        yield ctx
    finally:
        ctx.close()


@pytest.fixture
def page(context: BrowserContext) -> Page:
    return context.new_page()


@pytest.fixture
def shots(request: pytest.FixtureRequest) -> Shots:
    return Shots(request.node.name)


# ------------------------------------------------------------------------------------------ helpers
def wait_gate(af: LocalAirflow, dag_id: str, run_id: str, task_id: str, timeout_s: float = 300) -> Any:
    """The open gate of ``task_id`` once it is open (failing fast if the run ends first)."""
    deadline = time.monotonic() + timeout_s
    while True:
        for detail in af.pending_reviews(dag_id, run_id):
            if detail["task_instance"]["task_id"] == task_id:
                return detail
        state = af.run_state(dag_id, run_id)
        assert state not in ("success", "failed"), f"ended {state} before {task_id}'s gate; " + broken(
            af, dag_id, run_id
        )
        assert time.monotonic() < deadline, f"no gate {task_id} in {dag_id}/{run_id} after {timeout_s:.0f} s"
        time.sleep(1)


def settle(detail: dict[str, Any]) -> None:
    """Wait until the gate has been open REVIEW_DELAY_S seconds."""
    opened = datetime.fromisoformat(detail["created_at"]).timestamp()
    time.sleep(max(0.0, opened + REVIEW_DELAY_S - time.time()))


def wait_success(af: LocalAirflow, dag_id: str, run_id: str, **kwargs: Any) -> None:
    state = af.wait_run(dag_id, run_id, timeout_s=300, poll_s=1, **kwargs)
    assert state == "success", f"ended {state}; " + broken(af, dag_id, run_id)


def stop_at_gates(detail: dict[str, Any]) -> str:
    return "Stop"


def rows(folder: Path, pattern: str = "*.jsonl.zst") -> list[dict[str, Any]]:
    return [row for path in sorted(folder.glob(pattern)) for row in JsonlFile(str(path)).iter_records()]


def ids(folder: Path, pattern: str = "*.jsonl.zst") -> list[str]:
    return [row["id"] for row in rows(folder, pattern)]


def report(root: Path) -> dict[str, Any]:
    return json.loads((root / "report" / "summary.json").read_text())


def desk_frame(page: Page) -> FrameLocator:
    """The review desk inside the Airflow UI (its tab or menu entry is an iframe), once loaded."""
    desk = page.frame_locator("iframe[src*='batchinfer/review']")
    expect(desk.get_by_test_id("gate-subject")).to_be_visible()
    expect(desk.get_by_test_id("status")).to_have_text("")  # everything loaded, no error
    return desk


def select(desk: FrameLocator, sample_ids: list[str]) -> None:
    for rid in sample_ids:
        desk.locator(f"[data-testid=sample-row][data-sample-id='{rid}'] [data-testid=select-sample]").check()
    expect(desk.get_by_test_id("selection-count")).to_have_text(f"{len(sample_ids)} selected")


def answer(page: Page, option: str, fields: dict[str, str] | None = None) -> dict[str, Any]:
    """Answer the gate shown on a Required Actions page: fill the form's fields, click the option's
    button; returns what the page sent (the PATCH body), once Airflow took it."""
    expect(page.get_by_test_id(f"hitl-option-{option}")).to_be_enabled()
    for name, value in (fields or {}).items():
        page.locator(f"input[name=element_{name}]").fill(value)
    with page.expect_response(lambda r: r.request.method == "PATCH" and "/hitlDetails" in r.url) as sent:
        page.get_by_test_id(f"hitl-option-{option}").click()
    response = sent.value
    assert response.status == 200, response.text()
    return dict(json.loads(response.request.post_data or "{}"))


# -------------------------------------------------------------------------------------------- tests
def test_the_trigger_form_shows_its_params_in_sections_with_advanced_collapsed(
    airflow: LocalAirflow, page: Page, shots: Shots
) -> None:
    """The picture of docs/reference/params.md: with BATCHINFER_DOCS_PICTURES=1 it is copied to
    docs/_static/trigger-form.png (tests/artifacts/trigger-form.png on every run)."""
    dag_id = "e2e_browser_trigger"
    airflow.wait_for_dag(dag_id)
    page.set_viewport_size({"width": 1400, "height": 1300})  # the whole form, Data open
    sign_in(page, airflow, f"/dags/{dag_id}")
    page.get_by_test_id("trigger-dag-button").click()
    form = page.get_by_role("dialog")
    # one accordion item per section, in SECTIONS' order (Airflow's own "Advanced Options" after them)
    triggers = form.get_by_role("button").filter(
        has_text=re.compile(f"^({'|'.join(map(re.escape, SECTIONS))})$")
    )
    expect(triggers).to_have_count(len(SECTIONS))
    assert [t.strip() for t in triggers.all_inner_texts()] == list(SECTIONS)
    expect(form.get_by_text("Run Parameters", exact=True)).to_have_count(0)  # no param left unsectioned

    def section(name: str) -> Any:
        return form.get_by_role("button", name=name, exact=True)

    def field(param: str) -> Any:  # a param's label (every kind of field has one; "*": required)
        return form.get_by_text(re.compile(rf"^{re.escape(param)}\s*\*?$"))

    # Airflow 3.3 opens the form with every section collapsed, one open at a time
    for name in SECTIONS:
        expect(section(name)).to_have_attribute("aria-expanded", "false")
    section("Data").click()
    expect(section("Data")).to_have_attribute("aria-expanded", "true")
    expect(field("input")).to_be_visible()
    expect(section(ADVANCED)).to_have_attribute("aria-expanded", "false")
    for knob in KNOBS:
        expect(field(knob)).to_be_hidden()
    path = shots.take_element(form, "trigger-form")
    shutil.copyfile(path, shots.folder.parent / "trigger-form.png")
    if os.environ.get("BATCHINFER_DOCS_PICTURES") == "1":
        shutil.copyfile(path, REPO / "docs" / "_static" / "trigger-form.png")

    section(ADVANCED).click()  # opening Advanced closes Data and shows the knobs
    expect(field("input")).to_be_hidden()
    for knob in KNOBS:
        expect(field(knob)).to_be_visible()
    shots.take(page, "trigger-form-advanced", full_page=False)


def test_the_trigger_form_submits_its_defaults_and_the_run_succeeds(
    airflow: LocalAirflow, runs: Runs, page: Page, shots: Shots
) -> None:
    dag_id = "e2e_browser_trigger"
    sign_in(page, airflow, f"/dags/{dag_id}")
    expect(page.get_by_test_id("trigger-dag-button")).to_be_visible()
    shots.take(page, "dag-page")
    page.get_by_test_id("trigger-dag-button").click()
    form = page.get_by_role("dialog")
    expect(form.get_by_role("button", name="Data", exact=True)).to_be_visible()
    shots.take(page, "trigger-form", full_page=False)
    with page.expect_response(lambda r: r.request.method == "POST" and r.url.endswith("/dagRuns")) as sent:
        page.get_by_test_id("trigger-dag-submit").click()
    assert sent.value.status == 200, sent.value.text()
    run = sent.value.json()
    assert run["conf"]["input"] == str(runs.root.parent / "trigger.jsonl")  # the defaults, untouched
    assert run["conf"]["worker_pool"] == "local://e2e-browser" and run["conf"]["engine"] == "simulated"
    run_id = run["dag_run_id"]

    wait_success(airflow, dag_id, run_id)
    page.goto(f"{airflow.url}/dags/{dag_id}/runs/{run_id}")
    expect(page.get_by_test_id("header-card").get_by_test_id("state-badge")).to_have_text("Success")
    shots.take(page, "run-succeeded")
    root = runs.run_root(run_id.replace(":", "-").replace("+", "-"))
    summary = report(root)
    assert summary["invariant"]["ok"], summary["invariant"]
    assert summary["invariant"]["input"] == 30
    assert [r["round"] for r in summary["rounds"]] == [0] and summary["approved"] > 0  # it ran


def test_a_reviewer_decides_on_the_desk_and_continues_with_a_hotter_temperature(
    airflow: LocalAirflow, runs: Runs, context: BrowserContext, page: Page, shots: Shots
) -> None:
    dag_id, run_id, root = "e2e_browser_review", runs.review, runs.run_root("review")
    gate = wait_gate(airflow, dag_id, run_id, "round_01.plan")
    rejected = ids(root / "round-00" / "rejected")
    failed = [r for r in rejected if int(r[1:]) % 5 == 0]  # the FAIL questions: an inference error each
    assert len(failed) == 8 and len(rejected) > len(failed)

    # the gate on the run's Required Actions page links to the run's review desk (a new tab)
    sign_in(page, airflow, f"/dags/{dag_id}/runs/{run_id}/required_actions")
    link = page.get_by_role("link", name="Review every sample on the review desk")
    expect(link).to_be_visible()
    shots.take(page, "gate")
    with context.expect_page() as opened:
        link.click()
    tab = opened.value
    assert tab.url.endswith("/plugin/review-desk"), tab.url
    desk = desk_frame(tab)
    expect(desk.get_by_test_id("gate-round")).to_have_text("0")
    groups = desk.get_by_test_id("group")
    expect(groups).to_have_count(2)  # "expected #, got #" and the inference errors
    shots.take(tab, "desk")

    # filter by one reason group; accept 3, drop 2 with a note
    groups.filter(has_text="inference_error").click()
    expect(desk.get_by_test_id("page-info")).to_contain_text(f"{len(failed)} shown")
    assert [r.get_attribute("data-sample-id") for r in desk.get_by_test_id("sample-row").all()] == failed
    shots.take(tab, "desk-filtered")
    accepted, dropped = failed[:3], failed[3:5]
    select(desk, accepted)
    desk.get_by_test_id("decide-accept").click()
    expect(desk.get_by_test_id("status")).to_contain_text("Recorded: Accept 3 samples")
    select(desk, dropped)
    desk.get_by_test_id("decision-note").fill(NOTE)
    desk.get_by_test_id("decide-drop").click()
    expect(desk.get_by_test_id("status")).to_contain_text("Recorded: Drop 2 samples")
    expect(desk.get_by_test_id("decision-row")).to_have_count(2)
    expect(desk.get_by_test_id("tally-accept")).to_have_text("3 accept")
    expect(desk.get_by_test_id("tally-drop")).to_have_text("2 drop")
    expect(desk.get_by_test_id("tally-retry")).to_have_text(f"{len(rejected) - 5} retry")
    desk.get_by_test_id("decisions-section").scroll_into_view_if_needed()
    shots.take(tab, "desk-decided")
    # the same page on its own, whole (docs/_static/review-desk.png is made from this one)
    whole = context.new_page()
    whole.set_viewport_size({"width": 1200, "height": 800})
    whole.goto(f"{airflow.url}/batchinfer/review/?" + urlencode({"dag_id": dag_id, "run_id": run_id}))
    expect(whole.get_by_test_id("decision-row")).to_have_count(2)
    # answers out of order: the group filter's page (50 rows) is held until the page size's (10) shows
    held: list[Route] = []
    whole.route(
        lambda url: "/page?" in url, lambda r: held.append(r) if "size=50" in r.request.url else r.continue_()
    )
    whole.locator("[data-testid=group]", has_text="expected").click()
    whole.get_by_test_id("page-size").select_option("10")
    expect(whole.get_by_test_id("page-info")).to_contain_text("page 1: 10 shown")
    assert len(held) == 1, [r.request.url for r in held]
    with whole.expect_response(lambda r: "/page?" in r.url and "size=50" in r.url):
        held[0].continue_()
    whole.wait_for_timeout(500)  # the stale answer reaches the page's script; it must not show
    expect(whole.get_by_test_id("page-info")).to_contain_text("page 1: 10 shown")
    expect(whole.get_by_test_id("sample-row")).to_have_count(10)
    shots.take(whole, "desk-whole")
    whole.close()

    # from the desk to the gate's Required Actions page (the UI itself goes there, not the iframe)
    desk.get_by_test_id("required-actions-link").click()
    tab.wait_for_url("**/tasks/round_01.plan/required_actions**")
    field = tab.locator("input[name=element_next_temperature]")
    expect(field).to_have_value("0.7")  # what the next round would run with
    field.fill("1.3")
    shots.take(tab, "gate-form")
    settle(gate)
    sent = answer(tab, "Continue")
    assert sent["chosen_options"] == ["Continue"] and sent["params_input"]["next_temperature"] == 1.3
    expect(tab.get_by_text("round_01.plan response successful")).to_be_visible()
    expect(tab.get_by_test_id("hitl-option-Continue")).to_be_disabled()
    shots.take(tab, "gate-answered")

    # the round after the gate: its pending set, the decisions' effects, the new temperature
    wait_success(airflow, dag_id, run_id, on_review=stop_at_gates, review_delay_s=REVIEW_DELAY_S)
    decided = set(accepted) | set(dropped)
    expected = sorted(set(rejected) - decided)
    assert sorted(ids(root / "round-01" / "reviewed")) == expected
    plan = json.loads((root / "round-01" / "plan.json").read_text())
    planned = [Path(s["uri"]) for s in plan["shards"]]
    assert sorted(i for uri in planned for i in ids(uri.parent, uri.name)) == expected
    assert {uri.parent for uri in planned} == {root / "round-01" / "reviewed"}
    assert plan["settings"]["temperature"] == 1.3 and plan["review"]["changes"] == {"temperature": 1.3}
    assert plan["reviewed"]["counts"] == {"accept": 3, "retry": len(expected), "drop": 2}

    by_review = rows(root / "results", "reviewed-r00-*")
    assert sorted(r["id"] for r in by_review) == accepted
    assert all(
        r["accepted_by_review"] and r["judgment"]["person"]["by"] == airflow.username for r in by_review
    )
    approved = ids(root / "results", "round0*")  # by the judge, in rounds 0 and 1
    assert sorted(ids(root / "results")) == sorted(approved + accepted)
    gone = rows(root / "dropped")
    assert sorted(r["id"] for r in gone) == dropped
    assert all(
        {**r["judgment"]["person"], "action": "drop", "note": NOTE} == r["judgment"]["person"] for r in gone
    )

    manifests = [p for p in (root / "round-01" / "jobs").glob("*.json") if p.name.count(".") == 2]
    assert manifests, "round 1 ran no job"
    for path in manifests:  # <shard>.<kind>.json, not .accepted.json / .error.json
        assert json.loads(path.read_text())["sampling"]["temperature"] == 1.3, path

    summary = report(root)
    assert summary["invariant"]["ok"], summary["invariant"]
    assert (summary["accepted_by_review"], summary["dropped_by_review"]) == (3, 2)


def test_people_judge_a_round_on_the_desk_one_by_one_and_by_filter(
    airflow: LocalAirflow, runs: Runs, page: Page, shots: Shots
) -> None:
    dag_id, run_id, root = "e2e_browser_people", runs.people, runs.run_root("people")
    gate = wait_gate(airflow, dag_id, run_id, "round_01.plan")
    everyone = sorted(ids(root / "round-00" / "rejected"))
    assert len(everyone) == 30 and not ids(root / "results")  # nobody approved by a model

    # Browse -> Review desk: the list of open gates, then this run's
    sign_in(page, airflow, "/")
    page.get_by_role("button", name="Browse").click()
    page.get_by_role("menuitem", name="Review desk").click()
    gates = page.frame_locator("iframe[src*='batchinfer/review']")
    row = gates.get_by_test_id("gate-row").filter(has_text=run_id)
    expect(row).to_contain_text("round_01.plan")
    shots.take(page, "gate-list")
    row.get_by_test_id("gate-link").click()
    desk = desk_frame(page)
    expect(desk.get_by_test_id("group")).to_have_text(["awaiting a person's verdict 30"])
    desk.get_by_test_id("browse-button").click()
    expect(desk.get_by_test_id("page-info")).to_contain_text("30 shown")
    assert set(desk.get_by_test_id("sample-reason").all_inner_texts()) == {"awaiting a person's verdict"}

    accepted = ["q00", "q01", "q02"]
    for rid in accepted:  # one by one
        select(desk, [rid])
        desk.get_by_test_id("decide-accept").click()
        expect(desk.get_by_test_id("status")).to_contain_text("Recorded: Accept 1 sample.")
    shots.take(page, "accepted-one-by-one")
    desk.get_by_test_id("search-text").fill("What is 7 +")  # q06, q13, q20, q27
    desk.get_by_test_id("search-button").click()
    expect(desk.get_by_test_id("page-info")).to_have_text("page 1: 4 shown, 30 rows read")  # total unknown
    retried = sorted(desk.get_by_test_id("sample-id").all_inner_texts())
    assert retried == ["q06", "q13", "q20", "q27"]
    desk.get_by_test_id("bulk-action").select_option("retry")
    desk.get_by_test_id("decide-bulk").click()
    expect(desk.get_by_test_id("bulk-what")).to_have_text("Retry all matching text “What is 7 +”?")
    shots.take(page, "bulk-confirm")
    desk.get_by_test_id("decide-bulk-confirm").click()
    expect(desk.get_by_test_id("status")).to_contain_text("Recorded: Retry all matching text “What is 7 +”")
    expect(desk.get_by_test_id("tally-accept")).to_have_text("3 accept")
    expect(desk.get_by_test_id("tally-retry")).to_have_text("27 retry")
    shots.take(page, "decided")

    desk.get_by_test_id("required-actions-link").click()
    page.wait_for_url("**/tasks/round_01.plan/required_actions**")
    settle(gate)
    sent = answer(page, "Stop")
    assert sent["chosen_options"] == ["Stop"]
    shots.take(page, "stopped")

    wait_success(airflow, dag_id, run_id)
    by_review = rows(root / "results", "reviewed-r00-*")
    assert sorted(r["id"] for r in by_review) == accepted == sorted(ids(root / "results"))
    assert all(
        r["accepted_by_review"] and r["judgment"]["person"]["by"] == airflow.username for r in by_review
    )
    assert sorted(ids(root / "round-01" / "reviewed")) == sorted(set(everyone) - set(accepted))
    decisions = (root / "round-00" / "review" / "decisions.jsonl").read_text().splitlines()
    *log, seal = [json.loads(line) for line in decisions]
    assert set(seal) == {"schema_version", "sealed_at"}  # the answer's task sealed the log it applied
    assert [(d["action"], d.get("ids")) for d in log[:3]] == [("accept", [rid]) for rid in accepted]
    assert (log[3]["action"], log[3]["filter"]["text"]) == ("retry", "What is 7 +") and len(log) == 4
    plan = json.loads((root / "round-01" / "plan.json").read_text())
    assert plan["review"]["choice"] == "Stop"
    assert plan["reviewed"]["counts"] == {"accept": 3, "retry": 27, "drop": 0}
    summary = report(root)
    assert summary["invariant"]["ok"], summary["invariant"]
    assert summary["accepted_by_review"] == 3 and summary["remaining_pending"] == 27


def test_model_output_is_shown_as_text_on_the_desk_and_in_the_gate(
    airflow: LocalAirflow, runs: Runs, page: Page, shots: Shots
) -> None:
    dag_id, run_id, root = "e2e_browser_echo", runs.echo, runs.run_root("echo")
    gate = wait_gate(airflow, dag_id, run_id, "tail.plan")
    [row] = rows(root / "round-00" / "rejected")
    assert (row["id"], row["result"]) == ("e00", HOSTILE)  # the engine answered the prompt itself
    assert HOSTILE in runs.echo_server.prompts

    requests: list[str] = []
    dialogs: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    sign_in(page, airflow, f"/dags/{dag_id}/runs/{run_id}/plugin/review-desk")
    desk = desk_frame(page)
    sample = desk.locator("[data-testid=sample-row][data-sample-id=e00]")
    expect(sample.get_by_test_id("sample-output")).to_have_text(HOSTILE)
    expect(sample.get_by_test_id("sample-prompt")).to_have_text(HOSTILE)
    expect(sample.get_by_test_id("sample-reason")).to_have_text("too long (57 > 40 chars)")
    frame = next(f for f in page.frames if "/batchinfer/review/" in f.url)
    assert frame.evaluate("() => [...document.scripts].map(s => new URL(s.src).pathname)") == [
        "/batchinfer/review/static/page.js"
    ]
    assert frame.evaluate("() => [...document.images].filter(i => i.src.includes('evil')).length") == 0
    assert frame.evaluate("() => document.querySelectorAll('[data-testid=sample-output] *').length") == 0
    shots.take(page, "desk")

    page.goto(f"{airflow.url}/dags/{dag_id}/runs/{run_id}/tasks/tail.plan/required_actions?map_index=-1")
    cells = page.locator("td", has_text="evil.example")
    expect(cells).to_have_count(2)  # prompt and output, in the body's table of rejected samples
    # the same text (the body keeps an invisible word joiner after "://" against GFM's autolinks)
    assert [t.replace("\u2060", "") for t in cells.all_inner_texts()] == [HOSTILE, HOSTILE]
    # no image (nothing fetched) and no link made of the model's URL
    assert page.evaluate("() => [...document.images].filter(i => i.src.includes('evil')).length") == 0
    assert page.evaluate("() => [...document.links].filter(a => a.href.includes('evil')).length") == 0
    scripts = "() => [...document.scripts].filter(s => s.textContent.includes('alert')).length"
    assert page.evaluate(scripts) == 0
    shots.take(page, "gate")
    settle(gate)
    answer(page, "Stop")

    assert not [u for u in requests if urlsplit(u).hostname == "evil.example"]
    assert not dialogs  # no alert(1) ran
    wait_success(airflow, dag_id, run_id)
    assert report(root)["invariant"]["ok"]
