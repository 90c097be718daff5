"""Shards and job specs for tests that drive real workers through failures, and a polling wait."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import shard_dataset


def shard(tmp_path: Path, n: int) -> tuple[RunLayout, Any]:
    src = tmp_path / "data.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "q": f"{i}"}) + "\n" for i in range(n)))
    layout = RunLayout(str(tmp_path / "run"))
    return layout, shard_dataset(str(src), layout.input).shards[0]


def infer_spec(layout: RunLayout, s: Any, job_id: str, **params: Any) -> JobSpec:
    return JobSpec(
        job_id=job_id,
        kind="infer",
        input=s.uri,
        outputs={
            "inferred": layout.inferred(0, "part-00000"),
            "manifest": layout.job_manifest(0, "part-00000", "infer"),
        },
        params={"prompt_template": "{{ q }}", **params},
    )


def in_place_spec(layout: RunLayout, s: Any, job_id: str, **params: Any) -> JobSpec:
    """An in-place job judged by the SIMULATED engine's verdicts."""
    return JobSpec(
        job_id=job_id,
        kind="in_place",
        input=s.uri,
        outputs={
            "approved": layout.result(0, "part-00000", tail=True),
            "rejected": layout.rejected(0, "part-00000"),
            "checkpoints": layout.checkpoints(0, "part-00000"),
            "manifest": layout.job_manifest(0, "part-00000", "in_place"),
        },
        params={"prompt_template": "{{ q }}", "judge": {"type": "llm"}, **params},
    )


def wait_for(predicate: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)
