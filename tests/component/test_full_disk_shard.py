"""The run's first task on a full disk (no Airflow processes: the operator itself, on a real tmpfs):
it fails without retrying, naming the run root and the remedy, and leaves nothing half-written."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.chaos import SmallDisk, partial_files

pytest.importorskip("airflow", reason="needs the airflow extra")
pytestmark = [pytest.mark.chaos, pytest.mark.airflow]


class FakeTI:
    dag_id, run_id, try_number = "chaos_disk", "manual__1", 1

    def get_dagrun_state(self, dag_id: str, run_id: str) -> str:
        return "success"


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    d = SmallDisk(tmp_path / "runs", size="1m")
    try:
        d.mount()
    except PermissionError as exc:
        pytest.skip(f"cannot mount a small tmpfs here ({exc}); needs CAP_SYS_ADMIN")
    try:
        yield d
    finally:
        d.free()
        d.unmount()


def shard_task(tmp_path: Path, root: Path, *, single_frame: bool = False) -> Any:
    """``single_frame``: a one-frame ``.jsonl.zst`` input, which cannot be split into byte ranges and
    is copied into shards (plain JSONL is read in place: nothing but small documents is written)."""
    import zstandard

    from airflow_batchinfer.operators.shard import ShardDatasetOperator

    # outside the small disk; ~600 KB of poorly compressible text
    text = "".join(json.dumps({"id": i, "q": os.urandom(300).hex()}) + "\n" for i in range(1000))
    data = tmp_path / ("data.jsonl.zst" if single_frame else "data.jsonl")
    data.write_bytes(zstandard.ZstdCompressor().compress(text.encode()) if single_frame else text.encode())
    config = {"input": str(data), "run_root": str(root), "prompt_template": "{{ q }}",
              "judge": {"type": "llm"}, "records_per_shard": 100}  # fmt: skip
    return ShardDatasetOperator(task_id="shard", config=config)


@pytest.mark.parametrize("room_kb", [0, 64], ids=["full", "almost-full"])
def test_the_shard_task_on_a_full_disk_names_the_path_and_leaves_nothing_half_written(
    tmp_path: Path, disk: SmallDisk, room_kb: int
) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    root = disk.path / "run"
    op = shard_task(tmp_path, root, single_frame=bool(room_kb))  # almost full: a copy does not fit
    disk.fill()
    if room_kb:  # room for the small documents, not for the shards
        os.truncate(disk.ballast, disk.ballast.stat().st_size - room_kb * 1024)
    with pytest.raises(AirflowFailException) as failed:
        op.execute({"ti": FakeTI()})
    message = str(failed.value)
    assert f"cannot write the run under {root}" in message and "No space left on device" in message
    assert "free space" in message and "clear this DAG run" in message
    assert partial_files(str(disk.path)) == []
    disk.free()
    summary = op.execute({"ti": FakeTI()})  # the remedy: space freed, the same task again
    assert summary["records"] == 1000 and partial_files(str(disk.path)) == []


def test_plain_jsonl_needs_no_room_for_shards(tmp_path: Path, disk: SmallDisk) -> None:
    """Round 0 reads plain JSONL in place: with room for the run's small documents only, the shard
    task succeeds (the copy of the previous test's single-frame input does not fit there)."""
    root = disk.path / "run"
    op = shard_task(tmp_path, root)
    disk.fill()
    os.truncate(disk.ballast, disk.ballast.stat().st_size - 64 * 1024)
    summary = op.execute({"ti": FakeTI()})
    assert summary["estimated"] and summary["records"] > 0  # range shards: counts estimated
    assert partial_files(str(disk.path)) == []
