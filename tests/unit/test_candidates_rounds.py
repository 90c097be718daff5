"""Candidates through rounds (issue 25, item 3): ``sampling.n`` > 1 on the worker's own job code
(SIMULATED engine and judge: each candidate's verdict is its own hash), each record one row whatever
``n`` is, ``select`` choosing what reaches results, the summary's approval per candidate index and
pass@k, the report's table, retries in the next round and in place."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.judges.candidates import pass_at_k
from airflow_batchinfer.run.report.build import build_report
from airflow_batchinfer.run.report.render import render_markdown
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.layout import RunLayout
from tests.support.fake_jobs import IDS, close, make_run, plan_round
from tests.support.rounds import rows_in
from tests.support.worker_jobs import run_jobs

N = 4


def run_round(cfg: RunConfig, slot: str = "round-00", kind: str = "infer_judge") -> dict[str, Any]:
    plan = plan_round(cfg, slot)
    run_jobs(cfg, [(kind, plan.round, s) for s in plan.shards], approval_rate=0.3)  # type: ignore[misc]
    return close(cfg, plan)


def candidates_run(tmp_path: Path, select: str, **settings: Any) -> RunConfig:
    (tmp_path / select).mkdir(exist_ok=True)
    cfg = make_run(tmp_path / select, sampling={"n": N, "max_tokens": 16, "temperature": 0.7}, **settings)
    return cfg.replace(select=select)


def verdicts_of(tmp_path: Path) -> dict[str, list[dict[str, Any]]]:
    """Each record's candidates with their verdicts, from a ``select: all`` run (an approved row
    keeps its approved candidates, a rejected one all of them): the same hashes decide every run."""
    cfg = candidates_run(tmp_path, "all")
    run_round(cfg)
    layout = RunLayout(cfg.run_root)
    return {r["id"]: r["candidates"] for r in rows_in(layout.results) + rows_in(layout.rejected_dir(0))}


def test_each_candidate_is_judged_and_select_all_keeps_every_approved_one(tmp_path: Path) -> None:
    cfg = candidates_run(tmp_path, "all")
    summary = run_round(cfg)
    layout = RunLayout(cfg.run_root)
    approved, rejected = rows_in(layout.results), rows_in(layout.rejected_dir(0))
    # one row per record, whatever n is
    assert Counter(r["id"] for r in approved + rejected) == Counter(IDS) and summary["invariant"]["ok"]
    assert summary["approved"] == len(approved) > 0 and summary["rejected"] == len(rejected) > 0
    for row in approved:
        kept = row["candidates"]
        assert kept and all(c["judgment"]["approved"] for c in kept)
        assert row["candidate"] == kept[0]["index"] and row["result"] == kept[0]["result"]
    texts = set()
    for row in rejected:  # every candidate, each with its own (rejecting) verdict
        assert [c["index"] for c in row["candidates"]] == list(range(N))
        assert not any(c["judgment"]["approved"] for c in row["candidates"])
        assert row["candidate"] == 0 and row["result"] == row["candidates"][0]["result"]
        texts |= {c["result"] for c in row["candidates"]}
    assert len(texts) == N * len(rejected)  # the candidates are N different answers
    # the summary's figures are the rows'
    by_index = [sum(any(c["index"] == i for c in r["candidates"]) for r in approved) for i in range(N)]
    approved_counts = Counter(len(r["candidates"]) for r in approved)
    expected = {
        str(k): round(sum(pass_at_k(N, c, k) * m for c, m in approved_counts.items()) / len(IDS), 4)
        for k in range(1, N + 1)
    }
    assert summary["candidates"] == {
        "n": N,
        "records": len(IDS),
        "approved_by_index": by_index,
        "pass_at": expected,
    }
    assert expected["1"] < expected[str(N)] == round(len(approved) / len(IDS), 4)  # pass@n: any approved
    # the report's table
    text = render_markdown(build_report(cfg))
    table = text.split("## Candidates")[1].splitlines()
    assert table[2].startswith("| round | n | records | approved by candidate") and "pass@4" in table[2]
    assert table[4].startswith(f"| 0 | {N} | {len(IDS)} | {', '.join(map(str, by_index))} |")


def test_first_approved_and_best_score_choose_among_the_same_verdicts(tmp_path: Path) -> None:
    verdicts = verdicts_of(tmp_path)
    for select in ("first_approved", "best_score"):
        cfg = candidates_run(tmp_path, select)
        run_round(cfg)
        approved = rows_in(RunLayout(cfg.run_root).results)
        assert approved
        for row in approved:
            ok = [c for c in verdicts[row["id"]] if c["judgment"]["approved"]]
            if select == "first_approved":
                chosen = ok[0]
            else:
                chosen = max(ok, key=lambda c: (c["judgment"]["score"], -c["index"]))
            assert (row["candidate"], row["result"]) == (chosen["index"], chosen["result"]), select
            assert row["judgment"] == chosen["judgment"] and "candidates" not in row


def test_the_next_round_generates_new_candidates_for_the_rejected(tmp_path: Path) -> None:
    cfg = candidates_run(tmp_path, "first_approved")
    first = run_round(cfg)
    second = run_round(cfg, "round-01")
    layout = RunLayout(cfg.run_root)
    assert second["pending"] == first["rejected"] and second["invariant"]["ok"]
    assert second["candidates"]["records"] == first["rejected"]
    retried = [r for r in rows_in(layout.results) if r["round"] == 1]
    assert retried and all(r["attempts"] == 2 and "candidates" not in r for r in retried)
    still = rows_in(layout.rejected_dir(1))
    # the new round's candidates, not the old ones carried along
    assert all(len(r["candidates"]) == N and r["attempts"] == 2 for r in still)
    assert Counter(r["id"] for r in rows_in(layout.results) + still) == Counter(IDS)


def test_in_place_judges_every_candidate_of_each_attempt(tmp_path: Path) -> None:
    cfg = candidates_run(tmp_path, "first_approved", strategy="in_place", max_attempts=2)
    summary = run_round(cfg, "tail", kind="in_place")
    layout = RunLayout(cfg.run_root)
    approved = rows_in(layout.results)
    assert summary["invariant"]["ok"] and summary["approved"] == len(approved) > 0
    assert all(r["judgment"]["approved"] and isinstance(r["candidate"], int) for r in approved)
    # in place, the candidates are counted per attempt
    assert summary["candidates"]["records"] == summary["attempts"]


def test_select_is_refused_unless_known(tmp_path: Path) -> None:
    from airflow_batchinfer.exceptions import ConfigError

    with pytest.raises(ConfigError, match="select 'best'"):
        candidates_run(tmp_path, "best")


def test_review_below_score_chooses_a_candidate_that_passes_and_people_see_the_rest(tmp_path: Path) -> None:
    cfg = candidates_run(tmp_path, "first_approved", review_below_score=0.5)
    summary = run_round(cfg)
    layout = RunLayout(cfg.run_root)
    approved, rejected = rows_in(layout.results), rows_in(layout.rejected_dir(0))
    assert summary["invariant"]["ok"] and approved
    assert all(r["judgment"]["score"] >= 0.5 for r in approved)
    held = [r for r in rejected if r["judgment"].get("for_review")]
    assert held and summary["for_review"] == len(held)
    # an approval held for people had no approved candidate scored 0.5 or more
    assert all(r["judgment"]["score"] < 0.5 for r in held if r["judgment"]["judge_approved"])


def test_a_human_judge_sees_every_record_and_no_candidate_is_counted_approved(tmp_path: Path) -> None:
    cfg = candidates_run(tmp_path, "first_approved", judge={"type": "human"})
    summary = run_round(cfg)
    assert summary["invariant"]["ok"] and summary["for_review"] == len(IDS) and summary["approved"] == 0
    assert summary.get("candidates") is None  # verdicts awaiting people: no pass@k of 0 made up
    rejected = rows_in(RunLayout(cfg.run_root).rejected_dir(0))
    assert all(len(r["candidates"]) == N for r in rejected)  # people get every candidate
