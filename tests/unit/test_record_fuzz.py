"""The record paths fuzzed (issue 37): generated records, deep, wide, of odd types and strings, with
ids of every JSON type, huge numbers and the system's own field names (``review``,
``finish_reason``, ``attempts``, ``max_tokens``, ``judgment``, ...), thrown through read → prompt →
job → judge → review apply. Checked: the id invariant (every input line ends in exactly one place:
a reject with its reason, or its id in exactly one of results, a round's rejected rows, ``dropped/``)
and that no job fails for one record. Only those: what the records then mean (a field read as the
system's state, a score out of range) is other items' tests.

The reader and the prompt are fuzzed in memory with many examples; whole rounds (the worker's own
job code on the SIMULATED engine, the real close, review decisions applied at the gate, a second
round, the report) with a few examples of many records each, to stay within the unit tier's time.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_batchinfer.exceptions import PromptError
from airflow_batchinfer.prompts.build import PromptBuilder
from airflow_batchinfer.review.decisions import Decision, DecisionLog
from airflow_batchinfer.run.close import close_round
from airflow_batchinfer.run.jobs import round_kinds
from airflow_batchinfer.run.plan import CONTINUE, STOP, apply_choice, propose_slot
from airflow_batchinfer.run.prepare import prepare_run
from airflow_batchinfer.run.report.build import build_report
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import Plan, read_plan, write_plan
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage.reader import ErrorPolicy
from airflow_batchinfer.storage.records import id_text
from airflow_batchinfer.storage.validate import LineValidator, RowBlock
from tests.support.rounds import rows_in
from tests.support.worker_jobs import run_jobs

pytestmark = pytest.mark.security

# Names the system writes on its rows (and reads on a round's pending rows), as input fields.
RESERVED = (
    "review", "finish_reason", "attempts", "max_tokens", "judgment", "status", "result", "previous",
    "error", "sent_back", "candidates", "accepted_by_review", "adapter", "input_id", "spot_check",
    "custom_id", "ID", "Id", "id ", "_id", "body",
)  # fmt: skip
HUGE = st.sampled_from([2**63, -(2**63) - 1, 2**64, 10**30, -(10**40), 1e308, -1e-308, 5e-324])
ODD_TEXT = st.sampled_from(
    ["", " ", "1", "01", "-1", "1.0", "true", "null", "a@b", "@", "x@sql", "{{ 7 * 7 }}", "{% raw %}",
     "\u2028\u2029", "\x00", "\r", "\ufeffbom", "é" * 40, "ß", "\U0001f600", "\\", '"', "<script>"]
)  # fmt: skip
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), HUGE,
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20), ODD_TEXT,
)  # fmt: skip
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(RESERVED), st.text(max_size=8)), inner, max_size=4),
    ),
    max_leaves=6,
)
IDS = st.one_of(  # ids of every JSON type, the usable ones (strings, integers) most often
    st.integers(-3, 12), st.integers(-3, 12), st.integers(),
    st.sampled_from(["1", "2", "01", "a@b", "x@sql", "a"]),
    st.text(min_size=1, max_size=12), st.text(min_size=1, max_size=12),
    HUGE, st.sampled_from([None, True, False, "", 1.0, 1.5, [1], {"id": 1}]),
)  # fmt: skip


def deep(levels: int) -> Any:
    value: Any = "bottom"
    for i in range(levels):
        value = [value] if i % 2 else {"d": value}
    return value


@st.composite
def records(draw: st.DrawFn, reserved: tuple[str, ...] = RESERVED) -> dict[str, Any]:
    record: dict[str, Any] = {}
    if draw(st.integers(0, 9)):  # an id of any JSON type; or none
        record["id"] = draw(IDS)
    record["question"] = draw(st.one_of(st.text(max_size=30), ODD_TEXT, VALUES))
    for name in draw(st.lists(st.sampled_from(reserved), max_size=4, unique=True)):
        record[name] = draw(VALUES)
    for _ in range(draw(st.integers(0, 2))):  # wide
        record[draw(st.text(max_size=6))] = draw(VALUES)
    if not draw(st.integers(0, 9)):  # deep: around what a record may nest (storage.records.MAX_DEPTH)
        record["deep"] = deep(draw(st.sampled_from([5, 126, 127, 130, 260, 400])))
    if not draw(st.integers(0, 7)):
        record["wide"] = {f"k{i}": i for i in range(draw(st.integers(50, 400)))}
    return record


ODD_LINES = st.sampled_from(
    [b"{bad", b"[1, 2]", b'"text"', b"null", b"123", b'{"id": NaN}', b'{"id": 1e999}', b"\xff\xfe{}",
     b'{"id": "a", "id": "b"}', b"{}", b'{"id": "\\ud800"}', b"[" * 1100 + b"]" * 1100]
)  # fmt: skip


@st.composite
def lines(draw: st.DrawFn, max_size: int, reserved: tuple[str, ...] = RESERVED) -> list[bytes]:
    out = []
    for _ in range(draw(st.integers(1, max_size))):
        if not draw(st.integers(0, 9)):
            out.append(draw(ODD_LINES))
            continue
        record = draw(records(reserved))
        text = json.dumps(record, ensure_ascii=draw(st.booleans()))
        out.append(text.encode("utf-8", "surrogatepass"))
    return out


def fates(lines: list[bytes], rejected_lines: list[int], placed: list[Any]) -> None:
    """Every line once: a reject (by its line number) or its id, placed once (by its first line)."""
    assert len(rejected_lines) == len(set(rejected_lines)), rejected_lines
    counts = Counter(id_text(i) for i in placed)
    assert not [i for i, n in counts.items() if n > 1], counts
    taken: set[str] = set()
    for n, line in enumerate(lines, 1):
        if n in rejected_lines:
            continue
        record = orjson.loads(line)  # read, so JSON
        key = id_text(record["id"])
        assert key in counts and key not in taken, (n, line[:200])
        taken.add(key)
    assert taken == set(counts)


# ---------------------------------------------------------------------------- read, in memory
class Rejects:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def write(self, row: dict[str, Any]) -> None:
        self.rows.append(row)


@settings(
    max_examples=100,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(lines(max_size=8))
def test_every_line_read_is_kept_once_or_rejected_with_its_reason(block: list[bytes]) -> None:
    rejects = Rejects()
    check = LineValidator(ErrorPolicy("in.jsonl", "quarantine", rejects), id_field="id")
    good, ids, kept = check.check_block(block)
    assert all(r["error"] for r in rejects.rows)
    fates(block, [r["line_no"] for r in rejects.rows], ids)
    assert [r["id"] for r in kept] == ids
    for line in good:  # what was read can be written back (the job's rows are these records)
        orjson.dumps({"samples": [{"record": orjson.loads(line)}]})


def as_rows(block: list[bytes]) -> list[dict[str, Any]]:
    """The records of ``block``'s lines that a Parquet row could be (objects orjson writes back)."""
    out = []
    for line in block:
        try:
            record = orjson.loads(line)
            orjson.dumps(record)
        except (orjson.JSONDecodeError, orjson.JSONEncodeError):
            continue
        if type(record) is dict:
            out.append(record)
    return out


@settings(
    max_examples=100,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(lines(max_size=8))
def test_rows_that_come_parsed_are_checked_as_their_lines_are(block: list[bytes]) -> None:
    """One set of checks: records handed over parsed (a Parquet block) meet the fates their JSON
    lines meet (ids, repeats, depth, reject reasons and raw), unparsed."""
    rows = as_rows(block)
    by_rows, by_lines = Rejects(), Rejects()
    check_rows = LineValidator(ErrorPolicy("in", "quarantine", by_rows), id_field=None)
    check_lines = LineValidator(ErrorPolicy("in", "quarantine", by_lines), id_field=None)
    lines_of = [orjson.dumps(r) for r in rows]
    got = check_rows.check_block(RowBlock(rows, deep=True))
    assert (got[0].lines(), got[1], got[2]) == check_lines.check_block(lines_of)
    assert by_rows.rows == by_lines.rows
    assert vars(check_rows.stats) == vars(check_lines.stats)


# ---------------------------------------------------------------------------- prompt, in memory
# A template that reads fields the system also writes (``previous``: the attempt before, never a
# record's own on round 0 once item 1 lands).
TEMPLATE = "Q: {{ question }} | {{ record.get('review') }} | {{ record.get('judgment') }} | {{ previous }}"


@settings(
    max_examples=100,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(records(), st.booleans(), VALUES)
def test_a_prompt_is_built_or_is_its_records_error(record: dict[str, Any], batch: bool, body: Any) -> None:
    if batch:  # an OpenAI batch line: its body is the request
        record = {"custom_id": "c1", "body": body if isinstance(body, dict) else {"messages": body}}
    builder = PromptBuilder(None if batch else TEMPLATE, engine="simulated")
    try:
        request = builder.build(record, request_id="r1", attempt=int(record.get("attempts") == 1) + 1)
    except PromptError:  # that record's error row (worker.jobs.infer): anything else fails its job
        return
    assert request.prompt is not None or request.messages is not None


# ---------------------------------------------------------------------------- whole rounds
ARMS = ("base", "sql")
ABSENT = object()


def own_reviews(lines: list[bytes], rejected_lines: list[int]) -> dict[str, Any]:
    """Each read record's own ``review`` field (``ABSENT``: none), by its id as text."""
    records = (orjson.loads(line) for n, line in enumerate(lines, 1) if n not in rejected_lines)
    return {id_text(r["id"]): r.get("review", ABSENT) for r in records}


def run_round(cfg: RunConfig, plan: Plan) -> dict[str, Any]:
    """One round's jobs on the SIMULATED engine (each must succeed: run_jobs), then its close."""
    run_jobs(
        cfg, [(k, plan.round, s) for k in round_kinds(cfg, plan.mode) for s in plan.shards], approval_rate=0.5
    )
    summary = close_round(cfg, plan)
    assert summary is not None and summary["invariant"]["ok"], summary
    assert not summary.get("failed_shards") and summary["failed_records"] == 0, summary
    return summary


def row_ids(directory: str) -> list[Any]:
    return [row["id"] for row in rows_in(directory)]


def input_ids(rows: list[dict[str, Any]], fan_out: bool) -> list[Any]:
    """The input ids of judged rows: with a fan-out, each row id its input's and arm's, every arm once."""
    if not fan_out:
        return [row["id"] for row in rows]
    assert all(row["id"] == f"{id_text(row['input_id'])}@{row['adapter']}" for row in rows)
    arms: dict[str, list[str]] = {}
    for row in rows:
        arms.setdefault(id_text(row["input_id"]), []).append(row["adapter"])
    assert all(sorted(a) == sorted(ARMS) for a in arms.values()), arms
    return list(arms)


@settings(
    max_examples=5, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
@given(st.data(), st.booleans(), st.integers(0, 2))
def test_generated_records_through_rounds_and_review_each_end_in_one_place(
    data: st.DataObject, fan_out: bool, seed: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        block = data.draw(lines(max_size=30, reserved=RESERVED))
        (Path(tmp) / "data.jsonl").write_bytes(b"\n".join(block) + b"\n")
        arms = {"adapters": {"sql": "/models/lora-sql"}, "fan_out": "adapters_and_base"} if fan_out else {}
        cfg = RunConfig.of(
            input=f"{tmp}/data.jsonl", run_root=f"{tmp}/run", id_field="id", prompt_template=TEMPLATE,
            judge={"type": "llm"}, records_per_shard=8, max_rounds=2, **arms,
        )  # fmt: skip
        layout = RunLayout(cfg.run_root)
        prepare_run(cfg)
        plan = propose_slot(cfg, "round-00").plan
        write_plan(layout, plan)
        run_round(cfg, plan)
        # read: every line a reject, or its id in results or round 0's rejected rows, once
        judged = rows_in(layout.results) + rows_in(layout.rejected_dir(0))
        assert len({id_text(r["id"]) for r in judged}) == len(judged)  # row ids: one row each
        rejects = sorted({r["line_no"] for r in rows_in(layout.rejects)})  # a fan-out's: one per row
        fates(block, rejects, input_ids(judged, fan_out))

        # review: accept, drop or retry (the default) round 0's rejected rows, named by id as text
        named = sorted(id_text(i) for i in row_ids(layout.rejected_dir(0)))
        log = DecisionLog(cfg.run_root, 0)
        for action, ids in (("accept", named[seed::3]), ("drop", named[seed + 1 :: 3])):
            if ids:
                log.append(Decision.make(0, action, "fuzz", ids=ids))
        plan = apply_choice(
            cfg, propose_slot(cfg, "round-01"), CONTINUE if named else STOP, by="review (fuzz)"
        )
        write_plan(layout, plan)
        if plan.shards:
            run_round(cfg, plan)
        for slot in ("round-01", "tail"):
            if read_plan(layout, slot) is None:
                write_plan(layout, propose_slot(cfg, slot).plan)
        assert build_report(cfg)["invariant"]["ok"]
        # each judged row once: in results, dropped/ or round 1's rejected rows
        after = row_ids(layout.results) + row_ids(layout.dropped)
        after += row_ids(layout.rejected_dir(1)) if plan.shards else []
        assert Counter(map(id_text, after)) == Counter(id_text(r["id"]) for r in judged)
        # a record's own review field leaves with it as it came (the decisions' are in its judgment)
        own = own_reviews(block, rejects)
        for row in rows_in(layout.results) + rows_in(layout.dropped):
            key = id_text(row["input_id"] if fan_out else row["id"])
            assert row.get("review", ABSENT) == own[key], (key, row.get("review"))
