"""Retries that use feedback on the worker's own job code (SIMULATED engine with ``echo_prompt``: each
answer is the prompt it was sent, so a row's ``result`` shows what its attempt was sent with): a
round's retry told the judge's reason and a reviewer's note, in-place retries told the attempt
before, an in-place sample resumed from its checkpoint told what it would have been told, and a model
judge scoring a retry's answer with the prompt it was generated from."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

from airflow_batchinfer.engines.scoring import ScoreRequest, ScoreResult
from airflow_batchinfer.review.browse import RoundView
from airflow_batchinfer.review.decisions import Decision, DecisionLog
from airflow_batchinfer.run.jobs import job_spec
from airflow_batchinfer.run.plan import CONTINUE, apply_choice, pending_shards, propose_slot
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import read_job_manifest, write_plan, write_run_config
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.state.shards import PlannedShard
from airflow_batchinfer.storage import JsonlDir, JsonlFile, shard_dataset
from airflow_batchinfer.storage.shard_ref import ShardRef
from airflow_batchinfer.worker.checkpoints import CheckpointLog
from tests.support.fake_jobs import close, plan_round
from tests.support.worker_jobs import HashScoringEngine, run_jobs

# a, b per record: the echoed prompt's last number is b, never the answer a + b (the judge's "got")
PAIRS = [(2, 3), (4, 4), (1, 6), (5, 2), (3, 3), (6, 1)]
IDS = [f"q{i}" for i in range(len(PAIRS))]
RETRY = (
    "{{ question }}\nLast time: {{ previous.result }}\nJudge (attempt {{ previous.attempt }}): "
    "{{ previous.reason }}{% if previous.note %}\nReviewer: {{ previous.note }}{% endif %}"
)
ECHO = {"echo_prompt": True}


def arithmetic_run(tmp_path: Path, **settings: Any) -> RunConfig:
    data = tmp_path / "data.jsonl"
    lines = [
        {"id": i, "question": f"What is {a} + {b}?", "answer": a + b}
        for i, (a, b) in zip(IDS, PAIRS, strict=True)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in lines))
    cfg = RunConfig.of(
        input=str(data),
        run_root=str(tmp_path / "run"),
        prompt_template="{{ question }}",
        retry_template=RETRY,
        records_per_shard=3,
        **{"judge": {"type": "expected_answer", "field": "answer", "match": "number"}, **settings},
    )
    cfg = cfg.replace(
        id_field=shard_dataset(cfg.data.input, RunLayout(cfg.run_root).input, records_per_shard=3).id_field
    )
    write_run_config(cfg)  # what the desk renders prompts with
    return cfg


def rows_in(directory: str) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for f in JsonlDir(directory).jsonl_files() for r in f.iter_records()}


def in_place_rows(cfg: RunConfig, shard: ShardRef) -> dict[str, dict[str, Any]]:
    """The rows an in-place job wrote (its staged attempt, before a close accepts it)."""
    m = read_job_manifest(RunLayout(cfg.run_root).job_manifest(0, shard.shard_id, "in_place"))
    assert m is not None and m.committed is not None
    return {
        r["id"]: r for name in ("approved", "rejected") for r in JsonlFile(m.committed[name]).iter_records()
    }


def test_a_rounds_retry_is_told_the_judges_reason_and_the_reviewers_note(tmp_path: Path) -> None:
    cfg = arithmetic_run(tmp_path, review="every_round", max_rounds=2)
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg)
    run_jobs(cfg, [("infer_judge", 0, s) for s in plan.shards], **ECHO)
    first = close(cfg, plan)
    assert first["rejected"] == len(IDS)  # the echo's last number is b: never the sum
    round0 = rows_in(layout.rejected_dir(0))
    assert round0["q0"]["result"] == "What is 2 + 3?" and "previous" not in round0["q0"]  # read none
    assert round0["q0"]["judgment"]["reason"] == "expected 5, got 3"

    # a reviewer sends q0 back with a hint (its number makes the echo right), q1 with words only
    log = DecisionLog(cfg.run_root, 0)
    log.append(Decision.make(0, "retry", "ann", ids=["q0"], note="the sum is 5"))
    log.append(Decision.make(0, "retry", "ann", ids=["q1"], note="add them"))
    second_plan = apply_choice(cfg, propose_slot(cfg, "round-01"), CONTINUE, by="review (ann)")
    write_plan(layout, second_plan)
    run_jobs(cfg, [("infer_judge", 1, s) for s in second_plan.shards], **ECHO)
    second = close(cfg, second_plan)

    q0 = rows_in(layout.results)["q0"]
    assert (q0["status"], q0["attempts"], q0["round"]) == ("approved", 2, 1)
    assert q0["result"] == (
        "What is 2 + 3?\nLast time: What is 2 + 3?\nJudge (attempt 1): expected 5, got 3\n"
        "Reviewer: the sum is 5"
    )
    # truncated_in_thinking and thinking_token_budget: left out at their defaults
    assert q0["previous"] == {
        "attempt": 1, "result": "What is 2 + 3?", "reason": "expected 5, got 3", "score": None,
        "note": "the sum is 5", "finish_reason": "stop", "max_tokens": 256,
    }  # fmt: skip
    assert "sent_back" not in q0  # the decision was the attempt before's: its note is in previous
    assert rows_in(layout.reviewed(1))["q0"]["sent_back"]["note"] == "the sum is 5"
    rejected = rows_in(layout.rejected_dir(1))
    assert rejected["q1"]["previous"]["note"] == "add them" and rejected["q1"]["result"].endswith(
        "Reviewer: add them"
    )
    assert rejected["q2"]["previous"]["note"] is None and "Reviewer" not in rejected["q2"]["result"]
    assert (
        rejected["q2"]["result"]
        == "What is 1 + 6?\nLast time: What is 1 + 6?\nJudge (attempt 1): expected 7, got 6"
    )
    # the desk shows what each attempt was sent with: the worker's prompt (here, its answer)
    for r, rows in ((0, round0), (1, rejected)):
        view = RoundView(cfg.run_root, r)
        for row in rows.values():
            assert view.to_sample(row).prompt == row["result"], (r, row["id"])
    ids = [*rows_in(layout.results), *rejected]
    assert second["invariant"]["ok"] and Counter(ids) == Counter(IDS)


def test_in_place_retries_are_told_the_attempt_before(tmp_path: Path) -> None:
    cfg = arithmetic_run(tmp_path, strategy="in_place", max_rounds=1, max_attempts=3)
    shard = pending_shards(RunLayout(cfg.run_root), 0)[0]  # q0, q1, q2
    run_jobs(cfg, [("in_place", 0, shard)], **ECHO)
    q0 = in_place_rows(cfg, shard)["q0"]
    assert (q0["status"], q0["attempts"]) == ("max_attempts", 3)
    second = "What is 2 + 3?\nLast time: What is 2 + 3?\nJudge (attempt 1): expected 5, got 3"
    assert q0["previous"]["attempt"] == 2 and q0["previous"]["result"] == second
    assert q0["result"] == f"What is 2 + 3?\nLast time: {second}\nJudge (attempt 2): expected 5, got 3"


def test_an_in_place_sample_resumed_from_its_checkpoint_is_told_what_it_would_have_been(
    tmp_path: Path,
) -> None:
    """A worker killed after q0's first attempt was checkpointed: the resubmitted job goes on at
    attempt 2 with the checkpoint's ``previous`` (its answer, reason and truncation), not the
    record's (none)."""
    cfg = arithmetic_run(
        tmp_path, strategy="in_place", max_rounds=1, max_attempts=2, sampling={"max_tokens": 16}
    )
    shard = pending_shards(RunLayout(cfg.run_root), 0)[0]  # q0, q1, q2
    told = {"attempt": 1, "result": "five-ish", "reason": "expected 5, got nothing", "score": None,
            "note": None, "finish_reason": "length", "max_tokens": 16}  # fmt: skip
    spec = job_spec(cfg, "in_place", 0, PlannedShard.of(shard))

    async def killed_after_one_attempt() -> None:
        log = CheckpointLog(spec.outputs["checkpoints"])
        await log.record("q0", 1, previous=told)
        await log.flush()

    asyncio.run(killed_after_one_attempt())
    (status,) = run_jobs(cfg, [("in_place", 0, shard)], **ECHO)
    assert (
        status.counts.resume.samples == 1 and status.counts.outcomes.attempts == 1 + 2 + 2
    )  # q0 one, q1 q2 two
    q0 = in_place_rows(cfg, shard)["q0"]
    # a checkpoint written before previous said how it was cut reads as it was written (not cut in
    # thinking, no thinking budget: left out at their defaults)
    assert (q0["attempts"], q0["previous"]) == (2, told)
    assert q0["result"] == "What is 2 + 3?\nLast time: five-ish\nJudge (attempt 1): expected 5, got nothing"
    assert q0["max_tokens"] == 32  # the truncated attempt's retry: twice its max_tokens


class RecordingScorer(HashScoringEngine):
    """A classifier at the engine seam that keeps the conversation of every request it scores."""

    def __init__(self) -> None:
        super().__init__(("rejected", "approved"))
        self.scored: dict[str, list[dict[str, Any]]] = {}

    async def score(self, requests: list[ScoreRequest]) -> list[ScoreResult]:
        self.scored.update({r.request_id: list(r.messages or []) for r in requests})
        return await super().score(requests)


def test_a_model_judge_scores_the_conversation_a_retry_was_generated_from(tmp_path: Path) -> None:
    """A classifier on the judge pool scores each answer with the prompt its infer job sent: round 1's
    rows with the retry template, told round 0's verdict, under the retry system message (the echo's
    answer is that prompt, so the scored turns before the answer are the answer itself)."""
    cfg = arithmetic_run(
        tmp_path,
        system="Be brief.",
        retry_system="Try again, briefly.",
        judge={"type": "classifier", "threshold": 1.0},  # P(approved) < 1: every answer rejected
        judge_pool="local://judges",
        max_rounds=2,
    )
    assert cfg.judge_params().wire()["retry_template"] == RETRY
    assert cfg.judge_params().wire()["retry_system"] == "Try again, briefly."
    layout = RunLayout(cfg.run_root)
    for r, slot in enumerate(("round-00", "round-01")):
        plan = plan_round(cfg, slot)
        run_jobs(cfg, [("infer", r, s) for s in plan.shards], **ECHO)
        scorer = RecordingScorer()
        run_jobs(cfg, [("judge", r, s) for s in plan.shards], serving=scorer)
        assert close(cfg, plan)["rejected"] == len(IDS)
        rows = rows_in(layout.rejected_dir(r))
        assert sorted(scorer.scored) == sorted(rows) == sorted(IDS)
        for rid, row in rows.items():
            *asked, answer = scorer.scored[rid]
            assert answer == {"role": "assistant", "content": row["result"]}
            assert "\n".join(m["content"] for m in asked) == row["result"], (r, rid)  # what was sent
            assert asked[0] == {"role": "system", "content": "Be brief." if r == 0 else "Try again, briefly."}
    q0 = rows_in(layout.rejected_dir(1))["q0"]
    assert q0["result"].startswith(
        "Try again, briefly.\nWhat is 2 + 3?\nLast time: Be brief.\nWhat is 2 + 3?"
    )
    assert "Judge (attempt 1): P(approved) " in q0["result"]
