"""RoundView: a closed round's rejected rows, paged, filtered, sampled and found from its shards."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.exceptions import ReviewError
from airflow_batchinfer.judges.reasons import ReasonGroups
from airflow_batchinfer.review.bounds import Bounds
from airflow_batchinfer.review.browse import RoundView
from airflow_batchinfer.review.samples import field_value, matches
from airflow_batchinfer.review.trends import trend
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.layout import RunLayout
from tests.support.review_rounds import (  # noqa: F401 (fixtures, used by name)
    RARE,
    all_pages,
    approved,
    build_round,
    built,
    drop_manifest_groups,
    reason,
    rejected_ids,
    view,
)

RARE_GROUP = "a rare reason: # of a kind"


def test_shards_and_total_come_from_what_close_accepted(view: RoundView) -> None:
    shards = view.shards()
    assert [s.shard_id for s in shards] == [f"part-{i:05d}" for i in range(5)]
    assert [s.rows for s in shards] == [15, 15, 0, 15, 11]  # the third shard was approved whole
    assert view.total() == len(rejected_ids()) == 56
    assert all(s.uri == RunLayout(view.run_root).rejected(0, s.shard_id) for s in shards)


def test_a_sample_shows_prompt_output_verdict_and_the_input_record(view: RoundView) -> None:
    (s,) = view.page(size=1).samples
    assert (s.id, s.shard_id, s.position, s.round, s.attempts) == ("r000", "part-00000", 0, 0, 1)
    assert s.prompt == "Q: What is 0 + 1?"  # the run's template over the record, as the worker renders it
    assert s.output == "answer 0" and not s.approved and s.reason == reason(0) and s.score == 0.0
    assert s.record == {"id": "r000", "question": "What is 0 + 1?"} and s.group == "(no reason)"
    d = s.to_dict()
    assert d["record"] == s.record and d["group"] == s.group and d["prompt"] == s.prompt


@pytest.mark.parametrize("size", [1, 7, 15, 16, 50, 1_000])
def test_unfiltered_pages_seek_across_shard_boundaries_in_scan_order(view: RoundView, size: int) -> None:
    pages, samples = all_pages(view, size=size)
    assert [s.id for s in samples] == [s.id for s, _ in view.scan()] == rejected_ids()
    assert all(len(p.samples) == size for p in pages[:-1]) and 0 < len(pages[-1].samples) <= size
    assert all(p.total == 56 for p in pages) and sum(p.scanned for p in pages) == 56
    # positions are rows within each shard's file, counted from 0
    per_shard = Counter(s.shard_id for s in samples)
    for shard in view.shards():
        assert [s.position for s in samples if s.shard_id == shard.shard_id] == list(
            range(per_shard[shard.shard_id])
        )


def test_a_cursor_resumes_exactly_and_is_opaque(view: RoundView) -> None:
    first = view.page(size=20)
    assert first.cursor == "s1:5"  # 15 rows of the first shard, then 5 of the second
    again = view.page(first.cursor, size=20)
    assert [s.id for s in again.samples] == [s.id for s in view.page(first.cursor, size=20).samples]
    assert [s.id for s in again.samples] == rejected_ids()[20:40]
    assert again.cursor == "s3:10"  # the empty third shard is stepped over
    assert view.page("s4:11").samples == [] and view.page("s4:11").cursor is None
    assert view.page("s99:0").cursor is None
    for bad in ("x", "s1", "s-1:0", "1:2"):
        with pytest.raises(ReviewError, match="cursor"):
            view.page(bad)
    with pytest.raises(ReviewError, match="size"):
        view.page(size=0)


def test_filtered_pages_match_the_scan_and_continue_past_the_scan_limit(view: RoundView) -> None:
    group = 'missing field "…"'
    expected = [s.id for s, _ in view.scan() if matches(s, group)]
    assert len(expected) == 10
    pages, samples = all_pages(view, size=3, group=group)
    assert [s.id for s in samples] == expected and all(s.prompt for s in samples)
    assert pages[0].total == 10  # known from the manifests
    # a small scan limit: pages come back short (even empty), each with a cursor to go on from
    pages, samples = all_pages(view, size=3, group=group, scan_limit=4)
    assert [s.id for s in samples] == expected
    assert all(p.scanned <= 4 for p in pages) and any(len(p.samples) < 3 and p.cursor for p in pages)


def test_a_rare_group_reads_only_the_shards_whose_jobs_counted_it(view: RoundView) -> None:
    page = view.page(group=RARE_GROUP)
    assert [s.id for s in page.samples] == [f"r{RARE:03d}"] and page.cursor is None
    assert page.scanned == 15 and page.total == 1  # one shard of 15 rows read, of 56
    assert view.page(group="no such group").samples == []
    assert view.page(group="no such group").scanned == 0


def test_text_search_is_case_insensitive_over_id_prompt_output_and_reason(view: RoundView) -> None:
    def ids(text: str) -> list[str]:
        return [s.id for s in all_pages(view, size=4, text=text)[1]]

    assert ids("R003") == ["r003"]  # the id
    assert ids("what is 30 ") == ["r030"]  # only in the prompt
    assert ids("ANSWER 102") == ["r034"]  # the output (34 * 3)
    assert ids('field "f2') == [
        i for i in rejected_ids() if reason(int(i[1:])).startswith('missing field "f2')
    ]
    assert len(ids("q:")) == 56  # every prompt
    both = [s.id for s in all_pages(view, size=4, text="what is 1", group="too long by # words")[1]]
    assert both == [s.id for s, _ in view.scan() if matches(s, "too long by # words", "what is 1")] != []
    assert view.page(text="  ").total == 56  # a blank text is no filter


def test_sample_is_seeded_and_covers_shards_in_proportion(view: RoundView) -> None:
    a, b = view.sample(10, seed=7), view.sample(10, seed=7)
    assert [s.id for s in a] == [s.id for s in b] and len({s.id for s in a}) == 10
    assert [s.id for s in a] != [s.id for s in view.sample(10, seed=8)]
    assert [s.id for s in a] == sorted(s.id for s in a)  # in round order
    assert [s.id for s in view.sample(1_000)] == rejected_ids()  # more than the round: every row once
    drawn = Counter(s.shard_id for seed in range(300) for s in view.sample(8, seed=seed))
    for shard in view.shards():
        share = drawn[shard.shard_id] / (300 * 8)
        assert abs(share - shard.rows / 56) < 0.04, (shard, share)
    assert view.sample(0) == []


def test_find_and_at(view: RoundView) -> None:
    found = view.find("r078")
    assert found is not None and (found.shard_id, found.group) == ("part-00003", RARE_GROUP)
    assert view.at(found.shard_id, found.position) == found
    assert view.find("r001") is None  # approved: not in the rejected set
    assert view.find("r07") is None and view.find("nope") is None  # whole ids only
    assert view.at("part-00003", 99) is None and view.at("part-00009", 0) is None


def test_groups_from_manifests_equal_groups_from_reading_the_rows(built: RunConfig, tmp_path: Path) -> None:
    from_manifests = RoundView(built.run_root, 0).groups()
    counted = ReasonGroups()
    for s, _ in RoundView(built.run_root, 0).scan(prompts=False):
        counted.add(s.reason)
    assert from_manifests == counted.as_dict() and sum(from_manifests.values()) == 56
    # a round whose accepted docs do not count groups: its shards are read
    cfg = build_round(str(tmp_path))
    drop_manifest_groups(cfg)
    view = RoundView(cfg.run_root, 0)
    assert view.exact_groups() is None
    assert view.groups() == from_manifests
    assert RoundView(built.run_root, 0).exact_groups() == dict(counted.counts)
    # group filters still work, they just read every shard (until the view has counted them)
    page = RoundView(cfg.run_root, 0).page(group=RARE_GROUP)
    assert [s.id for s in page.samples] == [f"r{RARE:03d}"] and page.total is None and page.scanned == 56
    page = view.page(group=RARE_GROUP)
    assert [s.id for s in page.samples] == [f"r{RARE:03d}"] and page.total == 1 and page.scanned == 15


def test_trend_lists_closed_rounds(built: RunConfig) -> None:
    (row,) = trend(built.run_root)
    assert row["round"] == 0 and row["pending"] == 95 and row["rejected"] == 56 and row["approved"] == 39
    assert row["approval_rate"] == round(39 / 95, 4)


def test_a_round_without_rejected_rows_is_empty(built: RunConfig) -> None:
    view = RoundView(built.run_root, 3)
    assert view.shards() == [] and view.total() == 0 and view.groups() == {}
    assert view.page().samples == [] and view.page().cursor is None and view.sample(5) == []
    with pytest.raises(ReviewError):
        RoundView(built.run_root, -1)


def workers_text(builder: Any, record: dict[str, Any]) -> str | None:
    """What the worker's :class:`PromptBuilder` sends for ``record``, as the desk writes it out."""
    from airflow_batchinfer.review.prompt_text import _content

    try:
        request = builder.build(record, request_id="x", attempt=1)
    except Exception:
        return None
    parts = [(str(m["role"]), _content(m["content"])) for m in request.messages or ()]
    return request.prompt or (
        parts[0][1] if len(parts) == 1 else "\n\n".join(f"[{r}]\n{c}" for r, c in parts)
    )


@pytest.mark.parametrize(
    ("template", "system"),
    [
        ("Q: {{ question }}", None),
        ("{{question}} / {{ n }}\n\nContext: {{ context }}\n", "Be brief."),
        ("Q:\r\n{{ question }}\r", None),  # Jinja writes the template's newlines as "\n"
        ("{% if n %}{{ question }}{% endif %}", None),
        ("{{ question | upper }} {{ record.n }}", "sys"),
    ],
)
def test_prompts_are_the_workers_prompts(template: str, system: str | None) -> None:
    from airflow_batchinfer.prompts.build import PromptBuilder
    from airflow_batchinfer.review.prompt_text import Prompts

    prompts, builder = Prompts(template, system), PromptBuilder(template, system=system)
    records: list[dict[str, Any]] = [
        {"id": "a", "question": "What is {{ 1 + 1 }}?", "n": 3, "context": 'ünïcode "quoted" {% raw %}'},
        {"id": "b", "question": "x", "n": 2.5, "context": None},  # a float and None: Jinja's printing
        {"id": "c", "question": "y", "n": True, "context": ["a", 1]},
        {"id": "d", "question": "z"},  # a missing field: the prompt cannot be built
        {"id": "e", "custom_id": "e", "body": {"messages": [{"role": "user", "content": "hi"}]}},
    ]
    for record in records:
        assert prompts.text(record, "x", 1) == workers_text(builder, record), record


def test_the_desk_shows_the_prompt_the_worker_sent_with_the_rounds_system_message(tmp_path: Path) -> None:
    """Through the desk itself: the run's template and system message, built by the worker's
    ``PromptBuilder`` (a chat prompt: the system and user messages, as ``[role]`` blocks)."""
    from airflow_batchinfer.prompts.build import PromptBuilder
    from airflow_batchinfer.state.docs import read_plan, write_plan

    cfg = build_round(str(tmp_path), n=10, per_shard=10)
    plan = read_plan(RunLayout(cfg.run_root), "round-00")
    assert plan is not None
    plan.config = RunConfig.of(**{**cfg.to_dict(), "system": "Be brief."})  # what the round ran with
    write_plan(RunLayout(cfg.run_root), plan)
    rid = rejected_ids(10)[0]
    sample = RoundView(cfg.run_root, 0).find(rid)
    assert sample is not None
    assert sample.prompt == f"[system]\nBe brief.\n\n[user]\nQ: What is {int(rid[1:])} + 1?"
    assert sample.prompt == workers_text(
        PromptBuilder(cfg.prompt.prompt_template, system="Be brief."), sample.record
    )


def test_a_round_without_accepted_docs_counts_its_files_and_finds_any_id(tmp_path: Path) -> None:
    """Rejected files no close accounted for (and no run.json): rows are counted by reading them, ids
    of any form are found, and no prompt is rendered."""
    from tests.support.fake_jobs import write_rows

    layout = RunLayout(str(tmp_path / "run"))
    ids: list[object] = ['a"b', 7, "x\\y", "ünï", "7", "tab\there", "r1", "r10"]
    rows = [
        {"id": i, "q": "?", "judgment": {"approved": False, "reason": f"bad {k}"}} for k, i in enumerate(ids)
    ]
    write_rows(layout.rejected(0, "part-00000"), rows[:5])
    write_rows(layout.rejected(0, "part-00001"), rows[5:])
    view = RoundView(layout.root, 0)
    assert [s.rows for s in view.shards()] == [5, 3] and view.groups() == {"bad #": 8}
    for i in ids:
        found = view.find(str(i))
        assert found is not None and found.id == str(i) and found.prompt is None, i
    assert [s.record["id"] for s in view.with_ids(["7"])] == [7, "7"]  # both print as 7
    assert view.find("r") is None and view.find("tab") is None
    assert [s.position for s in all_pages(view, size=3)[1]] == [0, 1, 2, 3, 4, 0, 1, 2]


def test_a_jury_members_reasons_are_cut_like_the_samples_texts_and_read_whole() -> None:
    long = "why " * 100
    members = [
        {"name": "critic", "type": "llm", "approved": False, "reason": long, "score": 0.2, "raw": "left out"},
        {"name": "short", "type": "length", "approved": True, "reason": "ok"},
        "not a member",
    ]
    row = {
        "id": "a",
        "result": "x",
        "judgment": {"approved": False, "reason": "majority", "members": members},
    }
    sample = RoundView("/nowhere", 0).to_sample(row)
    assert sample.members == (
        {"name": "critic", "type": "llm", "approved": False, "reason": long, "score": 0.2},
        {"name": "short", "type": "length", "approved": True, "reason": "ok", "score": None},
    )
    shown = sample.bounded(Bounds(field_bytes=256))
    assert shown.truncated == {"members.0.reason": len(long)}
    assert len(shown.members[0]["reason"]) <= 256 and long.startswith(shown.members[0]["reason"])
    assert shown.members[1] == sample.members[1]
    assert field_value(sample, "members.0.reason") == long
    with pytest.raises(ReviewError, match=r"members\.<i>\.reason"):
        field_value(sample, "members.2.reason")
