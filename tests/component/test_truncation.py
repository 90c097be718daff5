"""Truncation on real workers over HTTP (issue 25, item 4): an in-place job whose retries raise
``max_tokens`` (SIMULATED engine, prompts that ask for more tokens than the job gives), and the
transformers engine cutting a real generation at a tiny ``max_tokens``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.state.docs import read_job_manifest
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlFile, shard_dataset
from tests.support.workers import WorkerProcess, start_worker

pytestmark = pytest.mark.slow


def shard(tmp_path: Path, records: list[dict[str, Any]]) -> tuple[RunLayout, Any]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    src = tmp_path / "data.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    layout = RunLayout(str(tmp_path / "run"))
    return layout, shard_dataset(str(src), layout.input).shards[0]


def rows(uri: str) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in JsonlFile(uri).iter_records()}


def in_place(layout: RunLayout, s: Any, job_id: str, **params: Any) -> JobSpec:
    sid = s.shard_id
    return JobSpec(
        job_id=job_id,
        kind="in_place",
        input=s.uri,
        outputs={
            "approved": layout.result(0, sid, tail=True),
            "rejected": layout.rejected(0, sid),
            "checkpoints": layout.checkpoints(0, sid),
            "manifest": layout.job_manifest(0, sid, "in_place"),
        },
        params={
            "prompt_template": "{{ q }} simulate_tokens={{ tokens }}",
            "judge": {"type": "llm"},
            "sampling": {"max_tokens": 16},
            "max_attempts": 3,
            **params,
        },
    )


def test_in_place_retries_of_truncated_samples_raise_max_tokens_until_they_pass(tmp_path: Path) -> None:
    # the judge approves every answer it sees: what is rejected is rejected for being truncated
    w = start_worker(tmp_path, engine_args={"approval_rate": 1.0})
    try:
        records = [{"id": "short", "q": "a", "tokens": 8}, {"id": "long", "q": "b", "tokens": 40}]
        layout, s = shard(tmp_path / "raised", records)
        status = w.wait(w.submit(in_place(layout, s, "raised")).job_id)
        assert status.state == "succeeded", status.error
        out = rows(layout.result(0, s.shard_id, tail=True))
        assert (out["short"]["attempts"], out["short"]["max_tokens"]) == (1, 16)
        # 16 (cut) -> 32 (cut) -> 64: the whole answer, which the judge then approves
        long = out["long"]
        assert (long["status"], long["attempts"], long["max_tokens"], long["finish_reason"]) == (
            "approved", 3, 64, "stop",
        )  # fmt: skip
        assert status.counts.truncated == 2 and status.counts.outcomes.attempts == 4

        # at the deployment's cap the retry runs with the cap, and the reason says so
        layout, s = shard(tmp_path / "capped", records)
        status = w.wait(w.submit(in_place(layout, s, "capped", max_tokens_cap=24)).job_id)
        assert status.state == "succeeded", status.error
        (stuck,) = rows(layout.rejected(0, s.shard_id)).values()
        assert (stuck["id"], stuck["status"], stuck["max_tokens"]) == ("long", "max_attempts", 24)
        assert stuck["judgment"]["reason"].startswith(
            "truncated: attempt 3 stopped at max_tokens 24 (finish_reason length), at the deployment's cap"
        )
        m = read_job_manifest(layout.job_manifest(0, s.shard_id, "in_place"))
        assert m is not None and m.reason_groups == {"truncated": 1} and m.counts.truncated == 3
    finally:
        w.stop()


def test_transformers_cuts_a_real_generation_at_a_tiny_max_tokens(
    tmp_path: Path, transformers_tiny: WorkerProcess
) -> None:
    """The random tiny Llama does not end an answer within 2 tokens: a real ``length`` finish, which
    the judge step rejects as truncated before the (rule) judge that would approve any text."""
    w = transformers_tiny
    layout, s = shard(tmp_path, [{"id": i, "q": f"Tell me about {i}"} for i in range(4)])
    sid = s.shard_id
    spec = JobSpec(
        job_id="fused",
        kind="infer_judge",
        input=s.uri,
        outputs={
            "approved": layout.result(0, sid),
            "rejected": layout.rejected(0, sid),
            "manifest": layout.job_manifest(0, sid, "infer_judge"),
        },
        params={
            "prompt_template": "{{ q }}",
            "sampling": {"max_tokens": 2},
            "judge": {"type": "length", "min_chars": 0},
        },
    )
    status = w.wait(w.submit(spec).job_id, timeout=300)
    assert status.state == "succeeded", status.error
    rejected = rows(layout.rejected(0, sid))
    assert len(rejected) == 4 and not rows(layout.result(0, sid))
    for row in rejected.values():
        assert (row["finish_reason"], row["max_tokens"], row["status"]) == ("length", 2, "rejected")
        assert row["judgment"]["reason"].endswith("a retry runs with max_tokens 4")
    assert status.counts.truncated == 4
