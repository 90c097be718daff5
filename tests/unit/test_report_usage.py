"""The run's GPU-seconds in its documents (issue 40): each round summary's ``usage`` (the run up to
that close, its own span from its jobs), the report's, and report.md's section; a run without
usage events says it does not know, with no zeros in their place."""

from __future__ import annotations

import json
import time
from pathlib import Path

from airflow_batchinfer.run.report.build import build_report
from airflow_batchinfer.run.usage import NO_EVENTS
from airflow_batchinfer.state.docs import read_summary
from airflow_batchinfer.state.docs.usage import UsageEvent, WorkerStart, record_usage
from airflow_batchinfer.state.layout import RunLayout
from tests.support.fake_jobs import close, finish_shard, make_run, plan_round

POOL = "local://gpu"


def _two_rounds(tmp_path: Path, events: bool) -> tuple[RunLayout, float]:
    cfg = make_run(tmp_path, max_rounds=2)
    layout = RunLayout(cfg.run_root)
    t0 = time.time() - 100.0
    if events:
        record_usage(layout, UsageEvent(kind="lease", at=t0, pool=POOL, replicas=2, gpus=1))
    plan = plan_round(cfg)
    for s in plan.shards:
        finish_shard(cfg, 0, s, {"r00"})
    close(cfg, plan)
    if events:
        start = WorkerStart(worker="w1", scheduled_s=0.5, started_s=1.0, loaded_s=3.0, ready_s=3.5)
        for kind, at in (("gate_open", t0 + 10), ("gate_answered", t0 + 40)):
            gate = UsageEvent(kind=kind, at=at, pool=POOL, replicas=2, slot="round-00", policy="keep")  # type: ignore[arg-type]
            record_usage(layout, gate)
        warm = UsageEvent(
            kind="warm", at=t0 + 45, pool=POOL, replicas=2, requested_at=t0 + 40, workers=(start,)
        )
        record_usage(layout, warm)
    plan = plan_round(cfg, "round-01")
    for s in plan.shards:
        finish_shard(cfg, 1, s, set())
    close(cfg, plan)
    build_report(cfg)
    return layout, t0


def test_summaries_and_the_report_carry_the_runs_gpu_seconds(tmp_path: Path) -> None:
    layout, t0 = _two_rounds(tmp_path, events=True)
    first, last = read_summary(layout, 0), read_summary(layout, 1)
    assert first is not None and first.usage is not None and first.usage.known
    assert [r.round for r in first.usage.rounds] == [0]  # the run up to its close
    assert last is not None and last.usage is not None
    assert [r.round for r in last.usage.rounds] == [0, 1]  # the earlier round's span from its summary
    assert last.usage.rounds[0].started_at == first.usage.rounds[0].started_at >= t0

    stored = json.loads((Path(layout.root) / "report" / "summary.json").read_text())
    usage = stored["usage"]
    assert usage["known"] and usage["open_lease"]  # no teardown yet: counted up to the report
    assert usage["leased_gpu_s"] >= 2 * 100
    assert usage["idle_gates_gpu_s"] == 2 * 30 and usage["rewarm_s"] == 5.0
    assert [r["slot"] for r in usage["rounds"]] == ["round-00", "round-01"]
    assert stored["rounds"][1]["usage"]["version"] == 1
    md = (Path(layout.root) / "report" / "report.md").read_text()
    assert "## GPU usage" in md and "idle at review gates: 60.0" in md
    assert "w1: 0.5 → 1.0 → 3.0 → 3.5" in md


def test_a_run_without_usage_events_does_not_know_its_gpu_seconds(tmp_path: Path) -> None:
    layout, _ = _two_rounds(tmp_path, events=False)
    stored = json.loads((Path(layout.root) / "report" / "summary.json").read_text())
    assert stored["usage"]["known"] is False and stored["usage"]["leased_gpu_s"] is None
    assert stored["usage"]["note"] == NO_EVENTS
    md = (Path(layout.root) / "report" / "report.md").read_text()
    assert f"Not known: {NO_EVENTS}." in md
