"""Issue 22, item 3: the worker holds its storage allow-list while a job runs, not only at submit.

A real ``batchinfer worker serve`` process (SIMULATED engine, loopback) runs an infer job under an
allowed prefix; while it runs, the output directory's parent is swapped for a symlink to a directory
outside the prefix (or moved out of it). Every local open, the final rename and the manifest are
checked again then: the job fails naming the path and the prefix, and nothing appears outside. The
storage layer's checks are also tested directly, under :func:`confined`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_batchinfer.exceptions import StorageError
from airflow_batchinfer.rpc.models import JobSpec, JobStatus
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlDir, JsonlFile, shard_dataset
from airflow_batchinfer.storage.confine import check_opened, confined
from airflow_batchinfer.storage.json_doc import write_json
from airflow_batchinfer.storage.location import resolve
from airflow_batchinfer.worker.security import PrefixPolicy
from tests.support.workers import WorkerProcess, start_worker

pytestmark = [pytest.mark.chaos]
N = 300


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    allowed.mkdir()
    outside.mkdir()
    return allowed, outside


@pytest.fixture
def worker(tmp_path: Path, dirs: tuple[Path, Path]) -> Iterator[WorkerProcess]:
    # ~0.1 s per chunk of 16 prompts: the job runs for seconds, time enough to swap mid-job
    engine = {"latency_base_s": 0.1, "approval_rate": 0.0}  # in place: every sample retried
    w = start_worker(tmp_path / "worker", concurrency=1, allow=[str(dirs[0])], engine_args=engine)
    try:
        yield w
    finally:
        w.stop()


def infer_job(allowed: Path) -> JobSpec:
    src = allowed / "data.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "q": f"{i}+{i}"}) + "\n" for i in range(N)))
    layout = RunLayout(str(allowed / "run"))
    shard = shard_dataset(str(src), layout.input).shards[0]
    sid = shard.shard_id
    return JobSpec(
        job_id=f"r00-{sid}-infer",
        kind="infer",
        input=shard.uri,
        outputs={"inferred": layout.inferred(0, sid), "manifest": layout.job_manifest(0, sid, "infer")},
        params={"prompt_template": "What is {{ q }}?", "input_records": N, "chunk_size": 16},
    )


def in_place_job(allowed: Path) -> JobSpec:
    """An in-place job whose checkpoint segments (a new file every 8 attempts) open all along."""
    infer = infer_job(allowed)
    layout = RunLayout(str(allowed / "run"))
    sid = Path(infer.input).name.split(".", 1)[0]
    outputs = {
        "approved": layout.result(0, sid),
        "rejected": layout.rejected(0, sid),
        "checkpoints": layout.checkpoints(0, sid),
        "manifest": layout.job_manifest(0, sid, "in_place"),
    }
    params = {**infer.params, "judge": {"type": "llm"}, "max_attempts": 3, "checkpoint_every": 8}
    return infer.model_copy(
        update={"job_id": f"r00-{sid}-in-place", "kind": "in_place", "outputs": outputs, "params": params}
    )


def run_with_swap(
    worker: WorkerProcess, spec: JobSpec, swap: Path, outside: Path, *, link: bool
) -> JobStatus:
    """Submit ``spec``; once it has written rows, move ``swap`` (the output directory's parent) aside
    and put a symlink to ``outside`` in its place (``link``), or move it into ``outside``."""
    assert worker.submit(spec).state == "running"
    deadline = time.monotonic() + 60
    while (s := worker.status(spec.job_id)).progress.done + s.counts.outcomes.attempts < 32:
        assert time.monotonic() < deadline, "the job made no progress"
        time.sleep(0.02)
    if link:
        os.rename(swap, swap.with_name(swap.name + ".moved"))
        swap.symlink_to(outside, target_is_directory=True)
    else:
        os.rename(swap, outside / swap.name)
    assert worker.status(spec.job_id).state == "running", "the swap came after the job ended"
    return worker.wait(spec.job_id)


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())


@pytest.mark.slow
def test_a_parent_swapped_for_a_symlink_mid_job_fails_the_job_and_writes_nothing_outside(
    dirs: tuple[Path, Path], worker: WorkerProcess
) -> None:
    allowed, outside = dirs
    spec = infer_job(allowed)
    round_dir = Path(spec.outputs["inferred"]).parent.parent  # run/round-00: outputs and manifest
    status = run_with_swap(worker, spec, round_dir, outside, link=True)
    assert status.state == "failed", status
    error = status.error or ""
    assert "StorageError" in error and "refused while the job ran" in error
    assert spec.outputs["inferred"] in error  # the path
    assert str(outside) in error and str(allowed) in error  # where it leads, and the prefix
    assert "Restore the directory, then retry the shard" in error
    assert list(outside.rglob("*")) == []  # no file, no directory
    assert not (
        round_dir.with_name("round-00.moved") / "inferred" / Path(spec.outputs["inferred"]).name
    ).exists()


@pytest.mark.slow
def test_checkpoints_opened_after_a_swap_are_refused(dirs: tuple[Path, Path], worker: WorkerProcess) -> None:
    """Each checkpoint segment is a new file: without the held allow-list the segments after the
    swap (and their directory) would be created outside."""
    allowed, outside = dirs
    spec = in_place_job(allowed)
    parent = Path(spec.outputs["checkpoints"]).parent  # run/checkpoints/round-00
    status = run_with_swap(worker, spec, parent, outside, link=True)
    assert status.state == "failed", status
    error = status.error or ""
    assert "refused while the job ran" in error and str(parent) in error and f"allowed: {allowed}" in error
    assert list(outside.rglob("*")) == []


@pytest.mark.slow
def test_an_output_directory_moved_out_of_the_prefix_mid_job_is_not_committed(
    dirs: tuple[Path, Path], worker: WorkerProcess
) -> None:
    """The writer's directory is held by fd, so a move takes it along: the final rename checks where
    the held directory is now, and the refused file's temporary is removed from there."""
    allowed, outside = dirs
    spec = infer_job(allowed)
    round_dir = Path(spec.outputs["inferred"]).parent.parent
    status = run_with_swap(worker, spec, round_dir, outside, link=False)
    assert status.state == "failed", status
    assert spec.outputs["inferred"] in (status.error or "") and str(outside) in (status.error or "")
    assert files_under(outside) == []  # neither the output nor its temporary stayed there
    assert not Path(spec.outputs["inferred"]).exists()


def test_a_local_writer_under_a_swapped_directory_is_refused_before_anything_is_created(
    dirs: tuple[Path, Path],
) -> None:
    allowed, outside = dirs
    (allowed / "run").symlink_to(outside, target_is_directory=True)
    policy = PrefixPolicy([str(allowed)])
    target = allowed / "run" / "deep" / "out.jsonl.zst"
    with confined(policy), pytest.raises(StorageError) as refused:
        JsonlFile(str(target)).writer_sync()
    assert str(target) in str(refused.value) and f"allowed: {allowed}" in str(refused.value)
    with confined(policy), pytest.raises(StorageError):
        write_json(resolve(str(allowed / "run" / "manifest.json")), {"a": 1})
    with confined(policy), pytest.raises(StorageError):
        JsonlDir(str(allowed / "run" / "checkpoints")).writer_sync().write_many([{"id": 1}])
    assert list(outside.rglob("*")) == []
    with JsonlFile(str(target)).writer_sync() as w:  # no job's policy held: as before
        w.write({"id": 1})
    assert (outside / "deep" / "out.jsonl.zst").exists()


def test_a_read_under_a_swapped_directory_is_refused(dirs: tuple[Path, Path]) -> None:
    allowed, outside = dirs
    (outside / "secret.jsonl").write_text('{"id": "s", "password": "x"}\n')
    (allowed / "input").symlink_to(outside, target_is_directory=True)
    with confined(PrefixPolicy([str(allowed)])), pytest.raises(StorageError) as refused:
        list(JsonlFile(str(allowed / "input" / "secret.jsonl")).iter_records())
    assert "secret.jsonl" in str(refused.value) and str(outside) in str(refused.value)


def test_a_commit_after_the_directory_moved_out_is_refused_and_leaves_nothing(
    dirs: tuple[Path, Path],
) -> None:
    allowed, outside = dirs
    (allowed / "out").mkdir()
    with confined(PrefixPolicy([str(allowed)])):
        writer = JsonlFile(str(allowed / "out" / "part.jsonl")).writer_sync()
        writer.write({"id": 1})
        os.rename(allowed / "out", outside / "out")  # the held directory goes along
        with pytest.raises(StorageError, match="refused while the job ran"):
            writer.commit()
    assert files_under(outside) == [] and files_under(allowed) == []


def test_the_check_reads_where_the_kernel_opened_the_file(dirs: tuple[Path, Path]) -> None:
    """The path asked for may resolve inside by now: the open descriptor is what counts."""
    allowed, outside = dirs
    (outside / "f").write_text("x")
    fd = os.open(outside / "f", os.O_RDONLY)
    try:
        with confined(PrefixPolicy([str(allowed)])), pytest.raises(StorageError):
            check_opened(fd, str(allowed / "f"), str(allowed / "f"))
        check_opened(fd, str(allowed / "f"), str(allowed / "f"))  # no policy held: no check
    finally:
        os.close(fd)


def test_an_allowed_job_still_writes_normally(dirs: tuple[Path, Path]) -> None:
    allowed, _ = dirs
    (allowed / "real").mkdir()
    (allowed / "link").symlink_to(allowed / "real", target_is_directory=True)  # a link that stays inside
    with confined(PrefixPolicy([str(allowed)])):
        with JsonlFile(str(allowed / "link" / "a" / "part.jsonl")).writer_sync() as w:
            w.write({"id": 1})
        rows = list(JsonlFile(str(allowed / "link" / "a" / "part.jsonl")).iter_records())
    assert rows == [{"id": 1}] and files_under(allowed) == ["real/a/part.jsonl"]
