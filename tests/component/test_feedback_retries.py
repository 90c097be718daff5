"""Retries that use feedback on real workers over HTTP (issue 26, item 1): the SIMULATED engine with
``echo_prompt`` (its answer is the prompt it was sent, so a row shows what its attempt was sent with)
for a rounds run whose round 1 is told round 0's judge reason and a reviewer's note, and an in-place
job killed with SIGKILL and resumed, every sample still told its previous attempt; the tiny Llama on
the transformers engine for a real model's retries with ``previous`` and a ``retry_sampling`` entry."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.review.browse import RoundView
from airflow_batchinfer.review.decisions import Decision, DecisionLog
from airflow_batchinfer.rpc.fingerprint import pin_input
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.run.close import close_round
from airflow_batchinfer.run.jobs import job_spec
from airflow_batchinfer.run.plan import CONTINUE, apply_choice, propose_slot
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import Plan, read_job_manifest, write_plan, write_run_config
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlDir, JsonlFile, shard_dataset
from airflow_batchinfer.worker.checkpoints import CheckpointLog
from tests.support.workers import WorkerProcess, start_worker

pytestmark = pytest.mark.slow

RETRY = (
    "{{ question }}\nLast time: {{ previous.result }}\nJudge (attempt {{ previous.attempt }}): "
    "{{ previous.reason }}{% if previous.note %}\nReviewer: {{ previous.note }}{% endif %}"
)


def rows_in(directory: str) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for f in JsonlDir(directory).jsonl_files() for r in f.iter_records()}


def run_round(w: WorkerProcess, cfg: RunConfig, plan: Plan) -> dict[str, Any]:
    """The plan's infer_judge jobs on the worker over HTTP, then the round's close."""
    for shard in plan.shards:
        spec = job_spec(cfg, "infer_judge", plan.round, shard)
        status = w.wait(w.submit(pin_input(spec, JsonlFile(spec.input).info())).job_id)
        assert status.state == "succeeded", status.error
    summary = close_round(cfg, plan)
    assert summary is not None and summary["invariant"]["ok"]
    return summary


def test_round_1_is_told_round_0s_judge_reason_and_the_reviewers_note(tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    pairs = [(2, 3), (4, 4), (1, 6), (5, 2), (3, 3), (6, 1), (2, 2), (7, 1)]
    data.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "question": f"What is {a} + {b}?", "answer": a + b}) + "\n"
            for i, (a, b) in enumerate(pairs)
        )
    )
    cfg = RunConfig.of(
        input=str(data),
        run_root=str(tmp_path / "run"),
        prompt_template="{{ question }}",
        retry_template=RETRY,
        judge={"type": "expected_answer", "field": "answer", "match": "number"},
        records_per_shard=4,
        review="every_round",
        max_rounds=2,
    )
    layout = RunLayout(cfg.run_root)
    cfg = cfg.replace(id_field=shard_dataset(cfg.data.input, layout.input, records_per_shard=4).id_field)
    write_run_config(cfg)
    w = start_worker(tmp_path, engine_args={"echo_prompt": True})
    try:
        plan = propose_slot(cfg, "round-00").plan
        write_plan(layout, plan)
        assert run_round(w, cfg, plan)["rejected"] == len(pairs)  # the echo's last number: b, not a + b
        DecisionLog(cfg.run_root, 0).append(Decision.make(0, "retry", "ann", ids=["q0"], note="the sum is 5"))
        plan = apply_choice(cfg, propose_slot(cfg, "round-01"), CONTINUE, by="review (ann)")
        write_plan(layout, plan)
        second = run_round(w, cfg, plan)
    finally:
        w.stop()
    q0 = rows_in(layout.results)["q0"]  # the note's number: the echo is right this time
    assert (q0["status"], q0["attempts"], second["approved"]) == ("approved", 2, 1)
    assert q0["result"] == (
        "What is 2 + 3?\nLast time: What is 2 + 3?\nJudge (attempt 1): expected 5, got 3\n"
        "Reviewer: the sum is 5"
    )
    rejected = rows_in(layout.rejected_dir(1))
    assert (
        rejected["q1"]["result"]
        == "What is 4 + 4?\nLast time: What is 4 + 4?\nJudge (attempt 1): expected 8, got 4"
    )
    assert rejected["q1"]["previous"] == {
        "attempt": 1, "result": "What is 4 + 4?", "reason": "expected 8, got 4", "score": None, "note": None,
        "finish_reason": "stop", "max_tokens": 256,
    }  # fmt: skip
    view = RoundView(cfg.run_root, 1)  # the desk: what each retry was sent with
    assert all(view.to_sample(row).prompt == row["result"] for row in rejected.values())
    assert Counter([*rows_in(layout.results), *rejected]) == Counter(f"q{i}" for i in range(len(pairs)))


def test_in_place_killed_and_resumed_tells_every_retry_its_previous_attempt(tmp_path: Path) -> None:
    """SIGKILL mid-job: the resubmitted job resumes each sample after its checkpointed attempt, told
    that attempt (the checkpoint's ``previous``), so each final answer (the echo of its last prompt)
    holds its whole chain of attempts, 1 to 5, each told the one before."""
    src = tmp_path / "data.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "question": f"Q{i}"}) + "\n" for i in range(40)))
    layout = RunLayout(str(tmp_path / "run"))
    s = shard_dataset(str(src), layout.input).shards[0]
    spec = JobSpec(
        job_id="feedback-in-place",
        kind="in_place",
        input=s.uri,
        outputs={
            "approved": layout.result(0, s.shard_id, tail=True),
            "rejected": layout.rejected(0, s.shard_id),
            "checkpoints": layout.checkpoints(0, s.shard_id),
            "manifest": layout.job_manifest(0, s.shard_id, "in_place"),
        },
        params={
            "prompt_template": "{{ question }}",
            "retry_template": "{{ question }} <{{ previous.attempt }}: {{ previous.result }}>",
            "judge": {"type": "regex", "pattern": "never"},
            "max_attempts": 6,
            "chunk_size": 40,
            "checkpoint_every": 20,
            "checkpoint_interval_s": 0.1,
        },
    )
    # 0.5 s an attempt: 6 attempts take 3 s, so the kill lands mid-job on a loaded machine too
    w1 = start_worker(tmp_path, engine_args={"echo_prompt": True, "latency_base_s": 0.5})
    try:
        w1.submit(spec)
        log = CheckpointLog(spec.outputs["checkpoints"])
        deadline = time.monotonic() + 60
        while len(log.dir.shards()) < 3:
            assert time.monotonic() < deadline, "no checkpoints"
            time.sleep(0.05)
    finally:
        w1.stop(signal.SIGKILL)
    checkpointed = log.load()
    unfinished = [st for st in checkpointed.values() if st.final is None]  # a final one is told no more
    assert unfinished and max(st.attempts for st in unfinished) >= 2, "killed before a retry or after the job"
    assert all(st.previous is not None and st.previous["attempt"] == st.attempts for st in unfinished)

    w2 = start_worker(tmp_path, engine_args={"echo_prompt": True})
    try:
        status = w2.wait(w2.submit(spec).job_id)
    finally:
        w2.stop()
    assert status.state == "succeeded", status.error
    assert status.counts.resume.samples == len(checkpointed)
    rows = {r["id"]: r for r in JsonlFile(spec.outputs["rejected"]).iter_records()}
    assert sorted(rows) == sorted(f"r{i}" for i in range(40))
    for rid, row in rows.items():
        q = f"Q{rid[1:]}"
        chain = q
        for attempt in range(1, 6):
            chain = f"{q} <{attempt}: {chain}>"  # attempt k+1's prompt, told attempt k's answer
        assert (row["attempts"], row["result"], row["previous"]["attempt"]) == (6, chain, 5), rid


def test_a_real_models_retries_read_previous_and_run_with_their_sampling_entry(
    tmp_path: Path, transformers_tiny: WorkerProcess
) -> None:
    """The tiny random Llama on the transformers engine: the retry's prompt holds the first answer
    (the manifests' prompt tokens grow by it) and the retry runs with its retry_sampling entry."""
    src = tmp_path / "data.jsonl"
    src.write_text("".join(json.dumps({"id": i, "q": f"Tell me about {i}"}) + "\n" for i in range(4)))
    layout = RunLayout(str(tmp_path / "run"))
    s = shard_dataset(str(src), layout.input).shards[0]

    def in_place(name: str, **params: Any) -> JobSpec:
        return JobSpec(
            job_id=name,
            kind="in_place",
            input=s.uri,
            outputs={
                "approved": layout.result(0, name, tail=True),
                "rejected": layout.rejected(0, name),
                "checkpoints": layout.checkpoints(0, name),
                "manifest": layout.job_manifest(0, name, "in_place"),
            },
            params={
                "prompt_template": "{{ q }}",
                "sampling": {"max_tokens": 4, "temperature": 0.8, "seed": 3},
                "judge": {"type": "length", "min_chars": 100_000},  # never long enough: two attempts each
                "truncated": "judge",
                "max_attempts": 2,
                **params,
            },
        )

    w = transformers_tiny
    plain = in_place("plain")
    told = in_place(
        "told",
        retry_template="{{ q }}. You said: {{ previous.result }}. Judge: {{ previous.reason }}",
        retry_sampling={"2": {"max_tokens": 8, "temperature": 1.1}},
    )
    for spec in (plain, told):
        status = w.wait(w.submit(spec).job_id, timeout=300)
        assert status.state == "succeeded", status.error
    tokens = {}
    for spec in (plain, told):
        m = read_job_manifest(spec.outputs["manifest"])
        assert m is not None and m.counts.outcomes.attempts == 8
        tokens[spec.job_id] = m.tokens["prompt"]
    rows = {r["id"]: r for r in JsonlFile(told.outputs["rejected"]).iter_records()}
    for row in rows.values():
        first = row["previous"]
        assert (row["attempts"], row["max_tokens"], first["attempt"], first["max_tokens"]) == (2, 8, 1, 4)
        assert first["result"] and first["reason"].startswith("too short")
    assert all("previous" not in r for r in JsonlFile(plain.outputs["rejected"]).iter_records())
    # the retries' prompts carried the first answers and reasons: many more prompt tokens
    assert tokens["told"] > tokens["plain"] + 4 * 8
