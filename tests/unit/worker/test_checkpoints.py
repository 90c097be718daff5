from __future__ import annotations

from pathlib import Path

from airflow_batchinfer.worker.checkpoints import CheckpointLog


async def test_events_are_batched_into_segments_and_reloaded(tmp_path: Path) -> None:
    log = CheckpointLog(str(tmp_path / "ck"), flush_every=3, flush_interval_s=60)
    for attempt in (1, 2):
        for sid in ("a", "b"):
            await log.record(sid, attempt)
    await log.record("c", 1, final={"id": "c", "status": "approved"})
    await log.flush()
    assert log.segments_written == 2  # 5 events: one segment of 3, then the rest
    state = CheckpointLog(str(tmp_path / "ck")).load()
    assert {k: v.attempts for k, v in state.items()} == {"a": 2, "b": 2, "c": 1}
    assert state["c"].final == {"id": "c", "status": "approved"} and state["a"].final is None


async def test_appending_after_a_restart_continues_numbering(tmp_path: Path) -> None:
    first = CheckpointLog(str(tmp_path / "ck"), flush_every=1)
    await first.record("a", 1)
    second = CheckpointLog(str(tmp_path / "ck"), flush_every=1)
    assert second.load()["a"].attempts == 1
    await second.record("a", 2)
    assert [s.index for s in second.dir.shards()] == [0, 1]
    assert CheckpointLog(str(tmp_path / "ck")).load()["a"].attempts == 2
    second.clear()
    assert second.dir.shards() == []
