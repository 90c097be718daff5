"""Review decisions: the versioned log, validation, concurrent appends, precedence and the tally."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from airflow_batchinfer.exceptions import ReviewClosedError, ReviewError
from airflow_batchinfer.review.browse import RoundView
from airflow_batchinfer.review.decisions import (
    MAX_IDS,
    MAX_NOTE,
    Decision,
    DecisionLog,
    Resolver,
    resolve,
    tally,
)
from airflow_batchinfer.review.samples import Sample
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.layout import RunLayout
from tests.support.review_rounds import build_round, drop_manifest_groups

AT = "2026-01-02T03:04:05+00:00"


def sample(sid: str = "r1", group: str = "expected #, got #", **kw: object) -> Sample:
    fields: dict[str, object] = dict(
        id=sid, shard_id="part-00000", position=0, round=0, attempts=1, prompt="Q: what is 2?",
        output="4", approved=False, reason="expected 2, got 4", score=None, group=group, record={"id": sid},
    )  # fmt: skip
    fields.update(kw)
    return Sample(**fields)  # type: ignore[arg-type]


def d(
    action: str, *, ids: tuple[str, ...] = (), filter: dict[str, str] | None = None, note: str = ""
) -> Decision:
    return Decision(0, action, "alice", AT, note, ids, filter)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------- the log
def test_append_and_read_round_trip(tmp_path: Path) -> None:
    log = DecisionLog(str(tmp_path / "run"), 2)
    assert log.read() == []
    first = Decision.make(2, "drop", "alice", ids=["r1", 7], note="junk")
    second = Decision.make(2, "accept", "bob", filter={"group": "expected #, got #", "text": None})
    log.append(first)
    log.append(second)
    assert log.read() == [first, second]
    assert first.ids == ("r1", "7") and second.filter == {"group": "expected #, got #"} and second.bulk
    path = Path(RunLayout(str(tmp_path / "run")).decisions(2))
    assert path == tmp_path / "run" / "round-02" / "review" / "decisions.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["schema_version"] for line in lines] == [1, 1]
    assert lines[0] == {"schema_version": 1, "round": 2, "action": "drop", "by": "alice", "at": first.at,
                        "note": "junk", "ids": ["r1", "7"], "filter": None}  # fmt: skip
    assert not [p for p in path.parent.iterdir() if ".tmp-" in p.name]  # written atomically


def test_an_unknown_version_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    log = DecisionLog(str(tmp_path), 0)
    log.append(d("retry", ids=("r1",)))
    path = Path(log.uri)
    row = {**d("drop", ids=("r2",)).to_dict(), "schema_version": 2}
    path.write_text(path.read_text() + json.dumps(row) + "\n")
    with pytest.raises(ReviewError, match=r"line 2: .*schema_version 2 is not supported"):
        log.read()
    with pytest.raises(ReviewError, match="version 3 is not supported"):
        Decision(0, "drop", "a", AT, ids=("x",), version=3)
    with pytest.raises(ReviewError, match="unknown fields"):
        Decision.from_dict({**d("drop", ids=("r2",)).to_dict(), "extra": 1})


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"action": "approve", "ids": ("a",)}, "action 'approve' is not one of accept, retry, drop"),
        ({"ids": ()}, "names no samples"),
        ({"ids": ("a",), "filter": {"group": "g"}}, "either ids or a filter"),
        ({"ids": ("a",), "note": "x" * (MAX_NOTE + 1)}, "at most 2000"),
        ({"ids": tuple(f"r{i}" for i in range(MAX_IDS + 1))}, "at most 10,000 ids"),
        ({"filter": {"reason": "x"}}, "unknown filter keys"),
        ({"filter": {"group": 3}}, "filter group must be text"),
        ({"ids": ("a", None)}, "a string or an integer"),
        ({"ids": "abc"}, "a list of sample ids"),
        ({"ids": ("a",), "by": " "}, "who made it"),
        ({"ids": ("a",), "at": "yesterday"}, "not an ISO 8601 time"),
        ({"ids": ("a",), "round": -1}, "round must be an integer"),
    ],
)
def test_invalid_decisions_are_refused(kwargs: dict[str, object], error: str) -> None:
    fields: dict[str, object] = {"round": 0, "action": "drop", "by": "alice", "at": AT, **kwargs}
    with pytest.raises(ReviewError, match=error):
        Decision(**fields)  # type: ignore[arg-type]


def test_append_checks_the_round_and_takes_exactly_10000_ids(tmp_path: Path) -> None:
    log = DecisionLog(str(tmp_path), 1)
    with pytest.raises(ReviewError, match="does not belong in round 1"):
        log.append(d("drop", ids=("r1",)))
    log.append(Decision.make(1, "drop", "a", ids=[f"r{i}" for i in range(MAX_IDS)]))
    assert len(log.read()[0].ids) == MAX_IDS
    assert Decision.make(1, "retry", "a", filter={}).filter == {}  # {}: every sample


def test_a_sealed_log_refuses_decisions_and_keeps_what_it_held(tmp_path: Path) -> None:
    log = DecisionLog(str(tmp_path), 0)
    first = d("drop", ids=("r1",))
    log.append(first)
    assert log.seal() == [first]
    assert log.seal() == [first]  # again (a retried task): the same decisions, one seal
    with pytest.raises(ReviewClosedError, match=r"round 0's gate was answered at .* not recorded"):
        log.append(d("accept", ids=("r2",)))
    assert log.read() == [first]
    lines = [json.loads(x) for x in Path(log.uri).read_text().splitlines()]
    assert len(lines) == 2 and set(lines[1]) == {"schema_version", "sealed_at"}
    assert DecisionLog(str(tmp_path), 1).seal() == []  # a round nobody decided on: sealed empty
    with pytest.raises(ReviewClosedError):
        DecisionLog(str(tmp_path), 1).append(Decision.make(1, "drop", "a", ids=["x"]))


def test_a_log_without_its_last_newline_still_appends(tmp_path: Path) -> None:
    log = DecisionLog(str(tmp_path), 0)
    first = d("drop", ids=("r1",))
    Path(log.uri).parent.mkdir(parents=True)
    Path(log.uri).write_text(json.dumps(first.to_dict()))  # edited by hand: no newline at the end
    log.append(second := d("accept", ids=("r2",)))
    assert log.read() == [first, second]


# ---------------------------------------------------------------------------------- precedence
def test_the_last_decision_that_selects_a_sample_wins() -> None:
    s = sample("r1")
    assert resolve([], s) == "retry"  # the default
    assert resolve([d("drop", ids=("r2",))], s) == "retry"
    assert resolve([d("drop", ids=("r1",)), d("accept", ids=("r1",))], s) == "accept"
    # id, then a later filter over its group: the filter wins; the other way round the id wins
    by_group = d("accept", filter={"group": "expected #, got #"})
    assert resolve([d("drop", ids=("r1",)), by_group], s) == "accept"
    assert resolve([by_group, d("drop", ids=("r1",))], s) == "drop"
    # a filter that does not match leaves earlier decisions standing
    assert resolve([d("drop", ids=("r1",)), d("accept", filter={"group": "other"})], s) == "drop"
    # text filters search id, prompt, output and reason; {} selects everything
    assert resolve([d("drop", filter={"text": "WHAT IS 2"})], s) == "drop"
    assert resolve([d("drop", filter={"text": "nowhere"})], s) == "retry"
    assert resolve(
        [d("accept", filter={}), d("retry", filter={"group": "expected #, got #", "text": "4"})], s
    ) == ("retry")
    resolver = Resolver([d("drop", ids=("r1",), note="junk")])
    decision = resolver.decision(s)
    assert decision is not None and decision.note == "junk" and resolver.decision(sample("r2")) is None
    assert not resolver.needs_prompts and Resolver([d("drop", filter={"text": "x"})]).needs_prompts


# --------------------------------------------------------------------------------------- tally
@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunConfig, RunConfig]:
    """The same round twice: with the manifests' reason groups, and without (its rows read)."""
    with_groups = build_round(str(tmp_path_factory.mktemp("with")))
    without = build_round(str(tmp_path_factory.mktemp("without")))
    drop_manifest_groups(without)
    return with_groups, without


DECISION_SETS = {
    "none": [],
    "ids": [d("drop", ids=("r000", "r002", "r001", "nope")), d("accept", ids=("r002",))],
    "groups": [
        d("accept", filter={"group": 'missing field "…"'}),
        d("drop", filter={"group": "(no reason)"}),
    ],
    "groups then ids": [
        d("accept", filter={"group": 'missing field "…"'}),
        d("drop", ids=("r006", "r010", "r000")),  # r006: missing field; r000: no reason
        d("retry", filter={"group": "(no reason)"}),  # after r000's id: retried again
        d("accept", filter={}),
        d("drop", ids=("r003",)),
    ],
    "text": [d("drop", filter={"text": "what is 1"}), d("accept", ids=("r010",))],
}


@pytest.mark.parametrize("name", list(DECISION_SETS))
def test_tally_counts_what_each_action_takes(built: tuple[RunConfig, RunConfig], name: str) -> None:
    decisions = DECISION_SETS[name]
    for cfg in built:
        view = RoundView(cfg.run_root, 0)
        expected = Counter(resolve(decisions, s) for s, _ in view.scan())
        got = tally(decisions, view)
        assert got == {a: expected.get(a, 0) for a in ("accept", "retry", "drop")}, (name, cfg.run_root)
        assert sum(got.values()) == 56
    if name == "groups then ids":
        assert tally(decisions, RoundView(built[0].run_root, 0)) == {"accept": 55, "retry": 0, "drop": 1}


def test_tally_from_counts_reads_no_row_without_ids(
    built: tuple[RunConfig, RunConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    view = RoundView(built[0].run_root, 0)

    def no_reading(*args: object, **kwargs: object) -> None:
        raise AssertionError("a row was read")

    monkeypatch.setattr(RoundView, "_lines", no_reading)
    got = tally(DECISION_SETS["groups"], view)
    assert got == {"accept": 10, "retry": 37, "drop": 9}
