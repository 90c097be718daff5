"""The run report of rounds run by lanes (issue 24 item 2): each round's shards by state, each lane's
shards, records and busy time, the failed shards linked to their quarantine records, in
``report/summary.json`` (``shard_status``) and ``report/report.md``; a round run before lanes
reports as before. The lanes are the real loop (real claims and lane documents) over a pool that
finishes or fails each job (tests.support.lane_rounds); the close is the real one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_batchinfer.run.lanes import claim_shard
from airflow_batchinfer.run.report.build import build_report
from airflow_batchinfer.run.report.render import MAX_FAILED_LINES, SLOWEST, shard_lines
from airflow_batchinfer.state.docs import read_failed, write_run_config
from airflow_batchinfer.state.docs.lanes import LaneDoc, LaneShard, read_lane, write_lane
from airflow_batchinfer.state.docs.shard_status import (
    FailedRow,
    LaneFigures,
    RoundShards,
    round_status,
)
from airflow_batchinfer.state.docs.summary import FailedShard, write_failed
from airflow_batchinfer.state.layout import RunLayout
from tests.support.fake_jobs import close, finish_shard, make_run, plan_round
from tests.support.lane_rounds import BROKEN, FinishingPool, lanes_run, run_lanes, set_times

EVEN = {f"r{i:02d}" for i in range(0, 30, 2)}


def test_a_round_run_by_lanes_reports_every_shard_and_every_lane(tmp_path: Path) -> None:
    cfg = lanes_run(tmp_path)  # 30 records, 10 shards of 3
    write_run_config(cfg)
    plan = plan_round(cfg)
    pool = FinishingPool(cfg, plan, EVEN, fail={"part-00004"})
    docs = run_lanes(cfg, plan, 3, pool)
    # known times: lane L's k-th shard claimed at 1000 + 100 L + 10 k, busy for k + 1 seconds
    busy = {}
    for doc in docs:
        times = {s.shard_id: (1000.0 + 100 * doc.lane + 10 * k, 1001.0 + 100 * doc.lane + 11 * k)
                 for k, s in enumerate(doc.shards)}  # fmt: skip
        set_times(cfg, 0, doc.lane, times)
        busy[doc.lane] = sum(e - c for c, e in times.values())
    close(cfg, plan)

    report = build_report(cfg)
    stored = json.loads((Path(cfg.run_root) / "report" / "summary.json").read_text())
    assert stored["shard_status"] == report["shard_status"]
    [rs] = [RoundShards.model_validate(x) for x in report["shard_status"]]
    assert (rs.round, rs.slot, rs.shards, rs.records, rs.lanes) == (0, "round-00", 10, 30, 3)
    assert rs.counts == {"done": 9, "failed": 1, "unfinished": 0, "unclaimed": 0}
    by_lane = {d.lane: d for d in docs}
    [owner] = [d.lane for d in docs if d.shard("part-00004") is not None]
    for f in rs.lane_figures:
        doc = by_lane[f.lane]
        failed = 1 if f.lane == owner else 0
        assert (f.shards, f.done, f.failed, f.unfinished) == (
            len(doc.shards),
            len(doc.shards) - failed,
            failed,
            0,
        )
        assert f.records == 3 * f.done and f.finished
        assert f.busy_s == pytest.approx(busy[f.lane])
    assert sum(f.shards for f in rs.lane_figures) == 10
    assert rs.busy_s == pytest.approx(sum(busy.values()))
    quarantine = Path(RunLayout(cfg.run_root).failed(0)) / "part-00004.json"
    assert rs.failed == [FailedRow(shard_id="part-00004", lane=owner, error=rs.failed[0].error,
                                   quarantine=str(quarantine))]  # fmt: skip
    record = read_failed(RunLayout(cfg.run_root), 0, "part-00004")
    assert record is not None and rs.failed[0].error == record.error and BROKEN in record.error
    assert rs.failed_count == 1 and rs.unfinished == []
    assert [f["shard_id"] for f in report["failed_shards"]] == ["part-00004"]

    md = (Path(cfg.run_root) / "report" / "report.md").read_text()
    assert "## Shards by lane" in md and "### Round 0" in md
    assert "10 shards (30 records) by 3 lanes: 9 done, 1 failed, 0 unfinished, 0 never claimed" in md
    assert "| lane | shards | done | failed | unfinished | records | busy s | finished |" in md
    for f in rs.lane_figures:
        row = (
            f"| {f.lane} | {f.shards} | {f.done} | {f.failed} | 0 | {f.records} | {busy[f.lane]:.1f} | yes |"
        )
        assert row in md, row
    assert f"- `part-00004` (lane {owner}; quarantine record `{quarantine}`): " in md
    assert f"- round 0 `part-00004` (infer_judge, lane {owner}): " in md  # the quarantine list links back


def test_a_round_no_lane_started_has_no_shard_figures(tmp_path: Path) -> None:
    cfg = make_run(tmp_path)
    write_run_config(cfg)
    plan = plan_round(cfg)
    for shard in plan.shards:
        finish_shard(cfg, 0, shard, {"r00"})
    close(cfg, plan)
    report = build_report(cfg)
    assert report["shard_status"] == []
    md = (Path(cfg.run_root) / "report" / "report.md").read_text()
    assert "Shards by lane" not in md and "| lane |" not in md


def _lane(doc_lane: int, lanes: int, *shards: LaneShard, claiming: str | None = None) -> LaneDoc:
    return LaneDoc(
        round=0, slot="round-00", lane=doc_lane, lanes=lanes, shards=list(shards), claiming=claiming
    )


def test_a_round_in_progress_shows_running_claimed_and_never_claimed_shards(tmp_path: Path) -> None:
    """What the lanes wrote so far: a shard a lane runs, one it claimed and had not recorded (its
    document names it as ``claiming``), one claimed by a lane whose document does not say (the claim
    names the lane), one in two documents (the later claim counts), one a lane ended that the close
    quarantined after all, and the rest never claimed."""
    cfg = lanes_run(tmp_path)
    layout = RunLayout(cfg.run_root)
    plan = plan_round(cfg)
    ids = [s.shard_id for s in plan.shards]
    write_lane(layout, _lane(0, 3,
        LaneShard(shard_id=ids[0], records=3, state="done", claimed_at=10.0, ended_at=14.0),
        LaneShard(shard_id=ids[3], records=3, state="running", claimed_at=15.0),
    ))  # fmt: skip
    write_lane(layout, _lane(1, 3,
        LaneShard(shard_id=ids[1], records=3, state="failed", claimed_at=10.0, ended_at=12.0, error="boom"),
        LaneShard(shard_id=ids[6], records=3, state="done", claimed_at=20.0, ended_at=21.0),
        claiming=ids[4],
    ))  # fmt: skip
    write_lane(layout, _lane(2, 3,
        LaneShard(shard_id=ids[6], records=3, state="running", claimed_at=11.0),  # an earlier take
        LaneShard(shard_id=ids[2], records=3, state="done", claimed_at=10.0, ended_at=11.5),
    ))  # fmt: skip
    for sid, lane in (
        (ids[0], 0),
        (ids[3], 0),
        (ids[1], 1),
        (ids[6], 1),
        (ids[2], 2),
        (ids[4], 1),
        (ids[5], 2),
    ):
        assert claim_shard(layout, 0, sid, lane)
    quarantined = FailedShard(shard_id=ids[2], uri=plan.shards[2].uri, records=3, round=0,
                              phase="infer_judge", error="no accepted manifest", remedy="re-run")  # fmt: skip
    write_failed(layout, quarantined)

    status = round_status(layout, plan)
    rows = {r.shard_id: r for r in status.rows}
    got = [(r.shard_id, r.state, r.lane, r.error) for r in status.rows]
    assert got == [
        (ids[0], "done", 0, None),
        (ids[1], "failed", 1, "boom"),
        (ids[2], "failed", 2, "no accepted manifest"),  # the close's word is the last
        (ids[3], "running", 0, None),
        (ids[4], "claimed", 1, None),  # lane 1 was claiming it, and its claim says so
        (ids[5], "claimed", 2, None),  # its claim names lane 2
        (ids[6], "done", 1, None),  # the later claim (lane 1's), not lane 2's earlier one
        (ids[7], "unclaimed", None, None),
        (ids[8], "unclaimed", None, None),
        (ids[9], "unclaimed", None, None),
    ]
    assert rows[ids[2]].quarantine == f"{layout.failed(0)}/{ids[2]}.json" and rows[ids[1]].quarantine is None
    # times from the claims themselves (a lane's `claiming` may name a race it lost)
    assert rows[ids[5]].claimed_at is not None and rows[ids[4]].claimed_at is not None
    assert status.counts() == {"done": 2, "failed": 2, "unfinished": 3, "unclaimed": 3}
    figures = status.figures()
    lanes = {f.lane: f for f in figures.lane_figures}
    assert (lanes[0].shards, lanes[0].done, lanes[0].unfinished, lanes[0].busy_s) == (2, 1, 1, 4.0)
    assert (lanes[1].shards, lanes[1].failed, lanes[1].records, lanes[1].busy_s) == (3, 1, 3, 3.0)
    assert (lanes[2].shards, lanes[2].failed, lanes[2].busy_s) == (2, 1, 1.5)
    assert figures.unfinished == [ids[3], ids[4], ids[5]]
    assert [(f.shard_id, f.lane, f.quarantine is not None) for f in figures.failed] == [
        (ids[1], 1, False),
        (ids[2], 2, True),
    ]
    md = "\n".join(shard_lines(figures))
    assert f"`{ids[1]}` (lane 1; not quarantined yet): boom" in md
    assert f"Unfinished shards: `{ids[3]}`, `{ids[4]}`, `{ids[5]}`" in md
    assert read_lane(layout, 0, 0) is not None  # nothing was written back


def figures(lanes: int, failed: int = 0) -> RoundShards:
    """A round of ``lanes`` lanes: lane L took L % 3 + 10 shards and was busy 100 + 7·L mod 311 s."""
    lane_figures = [
        LaneFigures(
            lane=i,
            shards=i % 3 + 10,
            done=i % 3 + 10,
            failed=0,
            unfinished=0,
            records=30,
            busy_s=float(100 + (7 * i) % 311),
            finished=i != 5,
        )
        for i in range(lanes)
    ]
    shards = sum(f.shards for f in lane_figures)
    listed = [
        FailedRow(shard_id=f"part-{k:05d}", lane=k % lanes, error=f"e{k}\nsecond line",
                  quarantine=f"/run/round-02/failed/part-{k:05d}.json")
        for k in range(min(failed, 100))
    ]  # fmt: skip
    return RoundShards(
        round=2, slot="round-02", shards=shards, records=3 * shards, lanes=lanes,
        counts={"done": shards - failed, "failed": failed, "unfinished": 0, "unclaimed": 0},
        busy_s=sum(f.busy_s for f in lane_figures), lane_figures=lane_figures,
        failed=listed,
        failed_count=failed,
    )  # fmt: skip


def test_320_lanes_are_a_summary_line_and_the_busiest_lanes() -> None:
    md = shard_lines(figures(320))
    rows = [
        line for line in md if line.startswith("| ") and not line.startswith("| lane") and "---" not in line
    ]
    busiest = sorted(range(320), key=lambda i: (-(100 + (7 * i) % 311), i))[:SLOWEST]
    assert [int(r.split("|")[1]) for r in rows] == busiest
    assert "- 320 lanes: shards per lane 10 to 12 (median 11); busy s per lane 100.0 to 410.0" in "\n".join(
        md
    )
    assert "1 not finished" in "\n".join(md)
    assert len(md) < 25  # readable, whatever the lane count
    few = [line for line in shard_lines(figures(16)) if line.startswith("| ") and "---" not in line]
    assert [int(r.split("|")[1]) for r in few[1:]] == list(range(16))  # every lane, in order


def test_many_failed_shards_are_listed_up_to_a_cap_and_counted_whole() -> None:
    md = shard_lines(figures(4, failed=250))
    listed = [line for line in md if line.startswith("- `part-")]
    assert len(listed) == MAX_FAILED_LINES
    assert (
        listed[0]
        == "- `part-00000` (lane 0; quarantine record `/run/round-02/failed/part-00000.json`): e0 second line"
    )
    assert any(
        line.startswith(f"- … and {250 - MAX_FAILED_LINES} more") and "round-02/failed/" in line
        for line in md
    )
    assert "Failed shards of round 2 (250):" in md
