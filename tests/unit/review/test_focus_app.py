"""The desk's focus view's API (issue 26 item 5), in Airflow's own api-server app at the seams of
test_app.py: a run whose rounds 0 and 1 closed (the tail gate reviews round 1), so a sample of
round 1 has an earlier attempt in round 0. ``GET attempts/{id}`` finds it (bounded: it reads at most
``ATTEMPTS_ROW_BUDGET`` rows and says when it stopped short); a gate's ``title`` names the run, not
its root; a decision's note is stored with it. Beside it, run ``jury``: a jury judges it (each
member's verdict on the desk) and retries render with a retry template told the attempt before; a
reviewer's retry decision on round 0 sent some samples back with a note, which their earlier attempt
shows; and run ``people``, judged by people, where there is no judge to calibrate. The ``desk``
fixture is the browser tests' too (tests/component/review/test_desk_focus_browser.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("airflow", reason="needs the airflow extra")
pytestmark = pytest.mark.airflow

from airflow_batchinfer.review.browse import RoundView  # noqa: E402
from tests.support import desk as t  # noqa: E402
from tests.support.desk_focus import (  # noqa: E402
    HOSTILE,
    JSON_OUTPUT,
    RETRY_SYSTEM,
    ROUND1,
    SYSTEM,
    desk,  # noqa: F401 (a fixture, used by name)
)


@pytest.fixture(autouse=True)
def _no_cached_attempts() -> None:
    from airflow_batchinfer.review.routes import fields

    fields._attempts_cache.clear()


def attempts(desk: t.Desk, sample_id: str, run: str = "multi", **params: Any) -> Any:
    return desk.get("bob", t.gate_url(run, f"/attempts/{sample_id}"), params=params)


def test_the_gate_reviews_round_1_and_its_title_names_the_run_not_its_root(desk: t.Desk) -> None:
    root = desk.roots["multi"]
    body = desk.get("bob", t.gate_url("multi")).json()
    assert body["round"] == 1
    gate = body["gate"]
    assert root in gate["subject"]  # an earlier release's subject, as Airflow stores it
    assert root not in gate["title"] and gate["run_name"] == "run" == Path(root).name
    assert gate["title"] == gate["subject"].replace(root, "run")
    [listed] = [g for g in desk.get("bob", "/batchinfer/api/gates").json()["gates"] if g["run_id"] == "multi"]
    assert listed["title"] == gate["title"]
    page = desk.get("bob", t.gate_url("multi", "/page"), params={"size": 50}).json()
    assert sorted(s["id"] for s in page["samples"]) == ROUND1


def test_a_samples_earlier_attempt_is_found_in_the_round_before(desk: t.Desk) -> None:
    r = attempts(desk, "r01")
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["round"], body["id"], body["searched"], body["complete"]) == (1, "r01", [0], True)
    [earlier] = body["attempts"]
    assert (earlier["round"], earlier["attempts"], earlier["output"]) == (0, 1, HOSTILE)  # as text
    assert earlier["reason"] == f"unsafe {HOSTILE}" and earlier["score"] == 0.01
    assert earlier["prompt"].startswith(f"[system]\n{SYSTEM}\n\n[user]\n")  # rendered for that round
    assert body["rows_read"] == 6  # round 0's first shard (r01 is there): the other two unread
    # the sample under review is round 1's row: a different attempt
    now = desk.get("bob", t.gate_url("multi", "/sample/r01")).json()["sample"]
    assert (now["round"], now["attempts"], now["output"]) == (1, 2, "second try at 1")


def test_an_id_with_no_earlier_rejected_row_has_no_attempts(desk: t.Desk) -> None:
    body = attempts(desk, "r00").json()  # approved in round 0
    assert (body["attempts"], body["complete"], body["searched"]) == ([], True, [0])
    body = attempts(desk, "r01", round=0).json()  # round 0 has no round before it
    assert (body["attempts"], body["searched"], body["rows_read"]) == ([], [], 0)
    assert attempts(desk, "r01", round=2).status_code == 404  # round 2 has not closed


def test_the_lookup_is_bounded_and_says_when_it_stopped_short(
    desk: t.Desk, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_batchinfer.review.routes import fields

    monkeypatch.setattr(fields, "ATTEMPTS_ROW_BUDGET", 3)
    body = attempts(desk, "r29").json()  # in round 0's last shard
    assert (body["attempts"], body["complete"], body["searched"]) == ([], False, [])
    assert 3 <= body["rows_read"] < 20 and body["row_budget"] == 3
    fields._attempts_cache.clear()
    monkeypatch.setattr(fields, "ATTEMPTS_ROW_BUDGET", 20)  # round 0's rejected rows: all of them
    body = attempts(desk, "r29").json()
    assert (len(body["attempts"]), body["complete"], body["rows_read"]) == (1, True, 20)


def test_find_within_reads_shards_up_to_its_budget(desk: t.Desk) -> None:
    view = RoundView(desk.roots["multi"], 0)
    found, read, complete = view.find_within("r02", 1_000)
    assert found is not None and found.output == JSON_OUTPUT and complete and read <= 7
    assert view.find_within("r02", 0) == (None, 0, False)
    missing, read, complete = view.find_within("nope", 1_000)
    assert (missing, read, complete) == (None, 20, True)


def test_a_decision_from_the_focus_view_keeps_its_note(desk: t.Desk) -> None:
    url = t.gate_url("multi", "/decisions")
    r = desk.post("alice", url, {"action": "drop", "ids": ["r07"], "note": "made up a source", "round": 1})
    assert r.status_code == 201, r.text
    assert r.json()["decision"]["note"] == "made up a source"
    [stored] = desk.get("bob", url).json()["decisions"]
    assert (stored["action"], stored["ids"], stored["note"], stored["by"]) == (
        "drop", ["r07"], "made up a source", "alice",
    )  # fmt: skip


def test_a_jurys_members_are_each_samples_in_the_list_its_attempts_and_the_field_endpoint(
    desk: t.Desk,
) -> None:
    r01 = desk.get("bob", t.gate_url("jury", "/sample/r01")).json()["sample"]
    assert r01["reason"] == "majority: 0 of 3 approve" and r01["score"] == 0.0
    assert [(m["name"], m["type"], m["approved"]) for m in r01["members"]] == [
        ("critic", "llm", False), ("long-enough", "length", False), ("digits", "regex", False),
    ]  # fmt: skip
    assert r01["members"][0] == {"name": "critic", "type": "llm", "approved": False,
                                 "reason": f"critic, round 1: unsafe {HOSTILE}", "score": 0.41}  # fmt: skip
    assert r01["members"][1]["score"] is None
    r02 = desk.get("bob", t.gate_url("jury", "/sample/r02")).json()["sample"]
    assert r02["reason"] == "majority: 1 of 3 approve (approved by critic)"  # split: the list marks it
    assert [m["approved"] for m in r02["members"]] == [True, False, False]
    page = desk.get("bob", t.gate_url("jury", "/page"), params={"size": 50}).json()["samples"]
    assert sorted(s["id"] for s in page) == ROUND1 and all(len(s["members"]) == 3 for s in page)
    (earlier,) = attempts(desk, "r01", run="jury").json()["attempts"]
    assert earlier["round"] == 0 and earlier["members"][0]["reason"] == f"critic, round 0: unsafe {HOSTILE}"
    at = {"shard": r01["shard_id"], "position": r01["position"], "round": 1}
    whole = desk.get("bob", t.gate_url("jury", "/field"), params={**at, "path": "members.0.reason"}).json()
    assert whole["value"] == r01["members"][0]["reason"]
    bad = desk.get("bob", t.gate_url("jury", "/field"), params={**at, "path": "members.3.reason"})
    assert bad.status_code == 400 and "members.<i>.reason" in bad.json()["detail"]
    plain = desk.get("bob", t.gate_url("multi", "/sample/r01")).json()["sample"]
    assert plain["members"] == [] and plain["sent_back"] is None  # no jury: no members


def test_each_attempt_has_the_prompt_it_was_sent_and_the_note_that_sent_it_back(desk: t.Desk) -> None:
    now = desk.get("bob", t.gate_url("jury", "/sample/r01")).json()["sample"]
    # round 1's prompt: the retry template under the retry system message, told round 0's answer,
    # the jury's reason and the reviewer's note
    assert now["prompt"] == (
        f"[system]\n{RETRY_SYSTEM}\n\n[user]\nq r01\nLast time: {HOSTILE}\nJudge: majority: 0 of 3 approve\n"
        "Reviewer: name the source you used"
    )
    (r01,) = attempts(desk, "r01", run="jury").json()["attempts"]
    assert r01["prompt"] == f"[system]\n{SYSTEM}\n\n[user]\nq r01"  # round 0's: the run's template
    assert {k: r01["sent_back"][k] for k in ("by", "note", "round")} == {
        "by": "ann", "note": "name the source you used", "round": 0,
    }  # fmt: skip
    (r02,) = attempts(desk, "r02", run="jury").json()["attempts"]
    assert r02["sent_back"]["note"] == "" and r02["sent_back"]["by"] == "ann"  # sent back without a note
    (r08,) = attempts(desk, "r08", run="jury").json()["attempts"]
    assert r08["sent_back"] is None  # no decision: retried as every undecided sample is
    r08_now = desk.get("bob", t.gate_url("jury", "/sample/r08")).json()["sample"]
    assert "Reviewer:" not in r08_now["prompt"] and "Last time: answer 8\n" in r08_now["prompt"]


def test_a_run_judged_by_people_has_no_calibration_on_the_desk(desk: t.Desk) -> None:
    assert desk.get("bob", t.gate_url("people")).json()["calibrated"] is False
    assert desk.get("bob", t.gate_url("multi")).json()["calibrated"] is True
    assert desk.get("bob", t.gate_url("jury")).json()["calibrated"] is True
