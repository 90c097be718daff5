"""The desk's focus view's API (issue 26 item 5), in Airflow's own api-server app at the seams of
test_app.py: a run whose rounds 0 and 1 closed (the tail gate reviews round 1), so a sample of
round 1 has an earlier attempt in round 0. ``GET attempts/{id}`` finds it (bounded: it reads at most
``ATTEMPTS_ROW_BUDGET`` rows and says when it stopped short); a gate's ``title`` names the run, not
its root; a decision's note is stored with it. Beside it, run ``jury``: a jury judges it (each
member's verdict on the desk) and retries render with a retry template told the attempt before; a
reviewer's retry decision on round 0 sent some samples back with a note, which their earlier attempt
shows; and run ``people``, judged by people, where there is no judge to calibrate. The ``desk``
fixture is the browser tests' too (tests/e2e/test_desk_focus_browser.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("airflow", reason="needs the airflow extra")
pytestmark = pytest.mark.airflow

from airflow_batchinfer.judges import Jury, Verdict, build_judge  # noqa: E402
from airflow_batchinfer.prompts.retries import previous_of  # noqa: E402
from airflow_batchinfer.review.browse import RoundView  # noqa: E402
from airflow_batchinfer.review.decisions import Decision, DecisionLog, Resolver  # noqa: E402
from airflow_batchinfer.review.samples import OUTPUT_FIELDS  # noqa: E402
from airflow_batchinfer.run.jobs import round_kinds  # noqa: E402
from airflow_batchinfer.state.config import RunConfig  # noqa: E402
from airflow_batchinfer.state.docs import write_run_config  # noqa: E402
from airflow_batchinfer.state.owner import RunIdentity  # noqa: E402
from tests.support.desk import desk_app  # noqa: E402
from tests.support.fake_jobs import close, counted, finish_job, make_run, plan_round, read_rows  # noqa: E402
from tests.support.owners import write_owner  # noqa: E402
from tests.unit.review import test_app as t  # noqa: E402

HOSTILE = '<script>alert(1)</script><img src=x onerror="alert(2)">'
JSON_OUTPUT = '{"answer": 42, "steps": ["add", "check"], "ok": false}'
CODE_OUTPUT = "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```\nThat is all."
LONG_OUTPUT = "\n".join(f"line {i}: " + "words " * 12 for i in range(60))
SYSTEM = "You are a careful grader."


def output(n: int, r: int) -> str:
    """What the model answered for record ``n`` in round ``r``: r01 hostile markup in round 0; r02
    JSON, r04 a fenced code block, r07 a long text in both rounds."""
    if n == 1:
        return HOSTILE if r == 0 else "second try at 1"
    special = {2: JSON_OUTPUT, 4: CODE_OUTPUT, 7: LONG_OUTPUT}
    return special.get(n, f"answer {n}" if r == 0 else f"second try at {n}")


def reason(n: int, r: int) -> str:
    if n == 1:
        return f"unsafe {HOSTILE}"
    return f"wrong answer ({n})" if r == 0 else f"still wrong: expected {n}"


def closed_rounds(
    cfg: RunConfig,
    judgment: Callable[[int, int], dict[str, Any]],
    fields: Callable[[dict[str, Any], int], dict[str, Any]],
) -> RunConfig:
    """Rounds 0 and 1 of ``cfg`` (30 records) closed: round 0 approves ids divisible by 3 and
    rejects the other 20; round 1 (those 20) approves ids divisible by 5 and rejects the other 16,
    each a second attempt with another output (:func:`output`) and ``judgment(n, r)``. Every row has
    ``fields(pending row, r)``."""
    write_run_config(cfg)
    kind = round_kinds(cfg, "rounds")[-1]
    for r, slot in enumerate(("round-00", "round-01")):
        plan = plan_round(cfg, slot)
        for shard in plan.shards:
            ok, bad = [], []
            for row in read_rows(shard["uri"]):
                n = int(row["id"][1:])
                done = fields(row, r)
                row = {k: v for k, v in row.items() if k not in OUTPUT_FIELDS}
                if (n % 3 == 0) if r == 0 else (n % 5 == 0):
                    ok.append({**row, "result": "fine", "status": "approved", "judgment": {"approved": True},
                               **done})  # fmt: skip
                    continue
                bad.append({**row, "result": output(n, r), "status": "rejected", "judgment": judgment(n, r),
                            **done})  # fmt: skip
            finish_job(cfg, kind, r, shard, {"approved": ok, "rejected": bad},
                       counted(approved=len(ok), rejected=len(bad)))  # fmt: skip
        close(cfg, plan)
    return cfg


def two_rounds(base: Path) -> RunConfig:
    """:func:`closed_rounds` with a system message (chat prompts), each rejection a reason and a score."""
    cfg = make_run(base, review="every_round", max_rounds=3, system=SYSTEM)
    return closed_rounds(
        cfg,
        lambda n, r: {"approved": False, "reason": reason(n, r), "score": round(n / 100 + r / 10, 2)},
        lambda row, r: {"attempts": r + 1, "round": r},
    )


ROUND1 = [f"r{i:02d}" for i in range(30) if i % 3 and i % 5]  # round 1's rejected rows

# the jury run: a jury of the run's model and two rules; retries told the attempt before
JURY = {
    "type": "jury",
    "judges": [
        {"type": "llm", "name": "critic"},
        {"type": "length", "min_chars": 20, "name": "long-enough"},
        {"type": "regex", "pattern": "[0-9]", "name": "digits"},
    ],
}
RETRY = (
    "{{ question }}\nLast time: {{ previous.result }}\nJudge: {{ previous.reason }}"
    "{% if previous.note %}\nReviewer: {{ previous.note }}{% endif %}"
)
RETRY_SYSTEM = "Try again, and cite your source."
SENT_BACK = {"r01": "name the source you used", "r02": ""}  # round 0's retry decisions, by ann


def jury_verdict(n: int, r: int) -> dict[str, Any]:
    """The jury's verdict on record ``n``'s answer in round ``r`` (rejected): the critic approves the
    even ids (the members split), the rules never do."""
    jury = build_judge(JURY, callables=None)
    assert isinstance(jury, Jury)
    critic = Verdict(n % 2 == 0, f"critic, round {r}: " + reason(n, r), round(0.3 + n / 100 + r / 10, 2))
    votes = [critic, Verdict(False, f"too short ({n % 7 + 5} < 20 chars)"), Verdict(False, "no digits")]
    return jury.decide(votes).as_dict()


def jury_rounds(base: Path) -> RunConfig:
    """As :func:`two_rounds` (30 records, rounds 0 and 1 closed), judged by :data:`JURY`, each retry
    rendered with :data:`RETRY` and :data:`RETRY_SYSTEM`, told the attempt before (the rows carry the
    ``previous`` their prompt read); round 0's reviewer sent :data:`SENT_BACK` back with their notes."""
    cfg = make_run(base, review="every_round", max_rounds=3, system=SYSTEM, judge=JURY,
                   retry_template=RETRY, retry_system=RETRY_SYSTEM)  # fmt: skip
    log = DecisionLog(cfg.run_root, 0)
    for rid, note in SENT_BACK.items():
        log.append(Decision.make(0, "retry", "ann", ids=[rid], note=note))
    sent = Resolver(log.seal())
    view = RoundView(cfg.run_root, 0)

    def fields(row: dict[str, Any], r: int) -> dict[str, Any]:
        before: dict[str, Any] = {}
        if r:  # the infer job's previous: the attempt this pending row records
            decision = sent.decision(view.to_sample(row))
            told = previous_of({**row, **({"sent_back": decision.sent_back()} if decision else {})})
            assert told is not None
            before = {"previous": told.as_dict()}
        return {"attempts": r + 1, "round": r, "finish_reason": "stop", "max_tokens": 256, **before}

    return closed_rounds(cfg, jury_verdict, fields)


def people_round(base: Path) -> RunConfig:
    """30 records judged by people: round 0 closed, every answered sample awaiting a verdict."""
    cfg = make_run(base, judge={"type": "human"})
    write_run_config(cfg)
    kind = round_kinds(cfg, "rounds")[-1]
    plan = plan_round(cfg)
    for shard in plan.shards:
        waiting = {"approved": False, "reason": "awaiting a person's verdict", "for_review": True}
        answered = {"status": "rejected", "judgment": waiting, "attempts": 1}
        rows = [{**row, "result": f"answer {row['id']}", **answered} for row in read_rows(shard["uri"])]
        finish_job(cfg, kind, 0, shard, {"approved": [], "rejected": rows}, counted(rejected=len(rows)))
    close(cfg, plan)
    return cfg


@pytest.fixture(scope="module")
def desk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[t.Desk]:
    """The desk's app with one DAG run, ``multi``: its tail gate (open) reviews round 1."""
    roots = {
        "multi": two_rounds(tmp_path_factory.mktemp("multi")).run_root,
        "jury": jury_rounds(tmp_path_factory.mktemp("jury")).run_root,
        "people": people_round(tmp_path_factory.mktemp("people")).run_root,
    }
    with desk_app(tmp_path_factory.mktemp("airflow")) as desk:
        # as an earlier release worded it (a path; the operator now names the run)
        subject = f"Round 2: review 16 pending records ({roots['multi']})"
        t.add_gate("multi", "tail.plan", {"run_root": roots["multi"], "aws_conn_id": None}, subject=subject)
        t.add_gate("jury", "tail.plan", {"run_root": roots["jury"], "aws_conn_id": None},
                   subject="Round 2: review 16 pending records (run)")  # fmt: skip
        t.add_gate("people", "round_01.plan", {"run_root": roots["people"], "aws_conn_id": None},
                   subject="Round 1: 30 samples await your verdict (run)")  # fmt: skip
        for run_id, root in roots.items():
            write_owner(root, RunIdentity(t.DAG_ID, run_id))
        desk.roots.update(roots)
        yield desk


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
