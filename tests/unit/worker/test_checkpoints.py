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


async def test_an_unfinished_attempt_keeps_what_the_next_one_is_told(tmp_path: Path) -> None:
    """``previous`` (retries.Previous as a dict) of the sample's last checkpointed attempt; events
    written before checkpoints kept it have none."""
    log = CheckpointLog(str(tmp_path / "ck"), flush_every=10)
    await log.record("a", 1, previous={"attempt": 1, "result": "5", "reason": "expected 4"})
    await log.record("a", 2, previous={"attempt": 2, "result": "3", "reason": "expected 4, got 3"})
    await log.record("b", 1)  # as before
    await log.flush()
    state = CheckpointLog(str(tmp_path / "ck")).load()
    assert state["a"].attempts == 2 and state["a"].previous == {
        "attempt": 2,
        "result": "3",
        "reason": "expected 4, got 3",
    }
    assert state["b"].previous is None
    raw = [e for f in log.dir.jsonl_files() for e in f.iter_records()]
    assert {tuple(sorted(e)) for e in raw if e["id"] == "b"} == {("attempt", "final", "id")}  # unchanged form
