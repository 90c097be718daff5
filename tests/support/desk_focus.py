"""Runs of two rounds, a jury's and the people's, behind the review desk's app: the focus view's app and
browser tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.judges import Jury, Verdict, build_judge
from airflow_batchinfer.prompts.retries import previous_of
from airflow_batchinfer.review.browse import RoundView
from airflow_batchinfer.review.decisions import Decision, DecisionLog, Resolver
from airflow_batchinfer.review.samples import OUTPUT_FIELDS
from airflow_batchinfer.run.jobs import round_kinds
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import write_run_config
from airflow_batchinfer.state.owner import RunIdentity
from tests.support import desk as t
from tests.support.desk import desk_app
from tests.support.fake_jobs import close, counted, finish_job, make_run, plan_round, read_rows
from tests.support.owners import write_owner

HOSTILE = '<script>alert(1)</script><img src=x onerror="alert(2)">'
JSON_OUTPUT = '{"answer": 42, "steps": ["add", "check"], "ok": false}'
CODE_OUTPUT = "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```\nThat is all."
SYSTEM = "You are a careful grader."
ROUND1 = [f"r{i:02d}" for i in range(30) if i % 3 and i % 5]  # round 1's rejected rows
RETRY_SYSTEM = "Try again, and cite your source."
SENT_BACK = {"r01": "name the source you used", "r02": ""}  # round 0's retry decisions, by ann


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


def two_rounds(base: Path) -> RunConfig:
    """:func:`closed_rounds` with a system message (chat prompts), each rejection a reason and a score."""
    cfg = make_run(base, review="every_round", max_rounds=3, system=SYSTEM)
    return closed_rounds(
        cfg,
        lambda n, r: {"approved": False, "reason": reason(n, r), "score": round(n / 100 + r / 10, 2)},
        lambda row, r: {"attempts": r + 1, "round": r},
    )


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
        rows = [{**row, "result": f"answer {row['id']}", **answered} for row in read_rows(shard.uri)]
        finish_job(cfg, kind, 0, shard, {"approved": [], "rejected": rows}, counted(rejected=len(rows)))
    close(cfg, plan)
    return cfg


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
            for row in read_rows(shard.uri):
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


def jury_verdict(n: int, r: int) -> dict[str, Any]:
    """The jury's verdict on record ``n``'s answer in round ``r`` (rejected): the critic approves the
    even ids (the members split), the rules never do."""
    jury = build_judge(JURY, callables=None)
    assert isinstance(jury, Jury)
    critic = Verdict(n % 2 == 0, f"critic, round {r}: " + reason(n, r), round(0.3 + n / 100 + r / 10, 2))
    votes = [critic, Verdict(False, f"too short ({n % 7 + 5} < 20 chars)"), Verdict(False, "no digits")]
    return jury.decide(votes).as_dict()


def output(n: int, r: int) -> str:
    """What the model answered for record ``n`` in round ``r``: r01 hostile markup in round 0; r02
    JSON, r04 a fenced code block, r07 a long text in both rounds."""
    if n == 1:
        return HOSTILE if r == 0 else "second try at 1"
    special = {2: JSON_OUTPUT, 4: CODE_OUTPUT, 7: LONG_OUTPUT}
    return special.get(n, f"answer {n}" if r == 0 else f"second try at {n}")


LONG_OUTPUT = "\n".join(f"line {i}: " + "words " * 12 for i in range(60))
