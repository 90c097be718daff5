"""Workers count the reason groups of the rows they reject into their completion manifests, and the
review page reads a round's groups from them (the worker's own job code, in process)."""

from __future__ import annotations

import json
from pathlib import Path

from airflow_batchinfer.judges.reasons import ReasonGroups
from airflow_batchinfer.review.browse import RoundView
from airflow_batchinfer.state.docs import JobManifest, read_job_manifest
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlFile
from tests.support.fake_jobs import close, plan_round
from tests.support.review_runs import make_run
from tests.support.worker_jobs import run_jobs


def staged_rejected_groups(manifest: JobManifest) -> dict[str, int]:
    groups = ReasonGroups()
    assert manifest.committed is not None
    for row in JsonlFile(manifest.committed["rejected"]).iter_records():
        groups.add(row["judgment"]["reason"])
    return groups.as_dict()


def test_infer_judge_manifests_count_the_rejected_rows_reason_groups(tmp_path: Path) -> None:
    cfg = make_run(tmp_path)
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg)
    run_jobs(cfg, [("infer_judge", 0, s) for s in plan.shards], fail_marker="FAIL")
    total: dict[str, int] = {}
    for shard in plan.shards:
        m = read_job_manifest(layout.job_manifest(0, shard.shard_id, "infer_judge"))
        assert m is not None
        groups = m.reason_groups
        assert groups is not None
        assert groups == staged_rejected_groups(m) and sum(groups.values()) == m.counts.outcomes.rejected
        for g, n in groups.items():
            total[g] = total.get(g, 0) + n
    assert total['inference_error: simulated failure: prompt contains "…"'] == 8  # q0, q5, … q35
    assert any(g.startswith("expected #") or g == "no number in the output" for g in total)
    close(cfg, plan)
    view = RoundView(cfg.run_root, 0)
    assert view.exact_groups() == total  # from the manifests, no row read
    assert view.groups() == ReasonGroups(total).as_dict()


def test_in_place_manifests_count_the_exhausted_rows_and_infer_has_none(tmp_path: Path) -> None:
    cfg = make_run(tmp_path, strategy="in_place", max_attempts=2)
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg, "tail")
    run_jobs(cfg, [("in_place", 0, s) for s in plan.shards], fail_marker="FAIL")
    for shard in plan.shards:
        m = read_job_manifest(layout.job_manifest(0, shard.shard_id, "in_place"))
        assert m is not None
        exhausted = m.counts.outcomes.max_attempts + m.counts.outcomes.error
        assert m.reason_groups is not None and sum(m.reason_groups.values()) == exhausted > 0
        assert m.reason_groups == staged_rejected_groups(m)
    run_jobs(cfg, [("infer", 0, s) for s in plan.shards], fail_marker="FAIL")
    uri = layout.job_manifest(0, plan.shards[0].shard_id, "infer")
    infer = read_job_manifest(uri)
    assert infer is not None and infer.reason_groups is None
    assert "reason_groups" not in json.loads(Path(uri).read_text())  # absent, as before it existed
