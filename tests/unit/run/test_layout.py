from __future__ import annotations

import pytest

from airflow_batchinfer.state.layout import RunLayout


def test_paths_follow_the_design_layout() -> None:
    L = RunLayout("s3://b/batchinfer/dag/run1")
    assert L.pending(0) == "s3://b/batchinfer/dag/run1/input"
    assert L.pending(2) == "s3://b/batchinfer/dag/run1/round-02/pending"
    assert L.inferred(1, "part-00003") == "s3://b/batchinfer/dag/run1/round-01/inferred/part-00003.jsonl.zst"
    assert L.rejected(0, "part-00003") == "s3://b/batchinfer/dag/run1/round-00/rejected/part-00003.jsonl.zst"
    assert L.result(0, "part-00003") == "s3://b/batchinfer/dag/run1/results/round00-part-00003.jsonl.zst"
    assert (
        L.result(4, "part-00003", tail=True) == "s3://b/batchinfer/dag/run1/results/tail-part-00003.jsonl.zst"
    )
    assert (
        L.job_manifest(0, "part-00003", "judge")
        == "s3://b/batchinfer/dag/run1/round-00/jobs/part-00003.judge.json"
    )
    assert L.summary(3) == "s3://b/batchinfer/dag/run1/round-03/summary.json"
    assert L.rejects == "s3://b/batchinfer/dag/run1/rejects"


@pytest.mark.parametrize(
    ("root", "name"),
    [("/data/out/run-7", "run-7"), ("s3://bucket/out/run-7/", "run-7"), ("memory://r", "r"), ("run", "run")],
)
def test_a_runs_name_is_the_last_part_of_its_root(root: str, name: str) -> None:
    assert RunLayout(root).name == name
