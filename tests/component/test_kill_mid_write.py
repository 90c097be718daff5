"""SIGKILL a sharding process in the middle of a shard: nothing partial is visible, a re-run completes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from airflow_batchinfer.storage import JsonlDir, JsonlFile, shard_dataset
from airflow_batchinfer.storage.location import resolve
from airflow_batchinfer.storage.manifest import read_manifest
from tests.support.roots import Root

RECORDS = 30_000
PER_SHARD = 12_000

CHILD = textwrap.dedent(
    """
    import json, sys, time
    from airflow_batchinfer.storage import shard_dataset
    src, dst, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    done = 0
    def progress(n, nbytes):
        global done
        done += n
        if done > 1.9 * {per_shard}:  # well inside the second shard
            print("MIDWAY", flush=True)
            time.sleep(600)
    shard_dataset(src, dst, records_per_shard={per_shard}, storage_options=options, progress=progress)
    """
).format(per_shard=PER_SHARD)


def make_input(root: Root) -> str:
    src = JsonlFile(root.uri("data.jsonl"), storage_options=root.storage_options)
    with src.writer_sync() as w:  # random payload: shards compress poorly, so S3 uploads go multipart
        w.write_many({"id": i, "payload": os.urandom(600).hex()} for i in range(RECORDS))
    return src.uri


@pytest.mark.slow
def test_sigkill_mid_shard_leaves_no_partial_shard_and_rerun_completes(root: Root) -> None:
    src = make_input(root)
    dst = root.uri("run", "input")
    options = dict(root.storage_options)
    if root.backend == "s3":
        options["default_block_size"] = 5 * 2**20  # multipart parts of 5 MiB: a part is uploaded mid-shard
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, src, dst, json.dumps(options)],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).parents[2],
    )
    assert child.stdout is not None
    deadline = time.monotonic() + 120
    line = b""
    while b"MIDWAY" not in line and time.monotonic() < deadline:
        line = child.stdout.readline()
        assert line or child.poll() is None, "child exited before reaching the middle of a shard"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    child.stdout.close()

    out = JsonlDir(dst, storage_options=root.storage_options)
    visible = out.shards()
    assert [s.name for s in visible] == ["part-00000.jsonl.zst"], "only the committed shard is visible"
    assert sum(1 for _ in out.file(visible[0].name).iter_records()) == PER_SHARD  # and it is complete
    loc = resolve(dst, root.storage_options)
    names = {p.rsplit("/", 1)[-1] for p in loc.fs.ls(loc.path, detail=False, refresh=True)}
    assert not any(n.startswith("part-00001") for n in names)
    manifest = read_manifest(out)
    assert manifest is not None and manifest.state == "in_progress"
    if root.backend == "s3":  # the kill really happened mid-upload: a multipart upload was left open
        bucket = loc.path.split("/", 1)[0]
        uploads = loc.fs.call_s3("list_multipart_uploads", Bucket=bucket).get("Uploads", [])
        assert any("part-00001" in u["Key"] for u in uploads)

    result = shard_dataset(src, dst, records_per_shard=PER_SHARD, storage_options=root.storage_options)
    assert not result.reused
    assert [d.records for d in result.shards] == [12_000, 12_000, 6_000]
    assert [r["id"] for r in out.iter_records()] == list(range(RECORDS))
