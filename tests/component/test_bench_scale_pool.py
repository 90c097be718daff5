"""bench/scale.py part (a) for real, small: two simulated workers, the shard jobs over the RPC, every
record answered (the part read the job manifests as dicts after they became typed, unnoticed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bench.scale import REPO

pytestmark = pytest.mark.slow


def test_part_a_runs_every_record_on_the_warm_pool() -> None:
    cmd = [sys.executable, str(REPO / "bench" / "scale.py"), "--parts", "a", "--records", "3000"]
    cmd += ["--shards", "3"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, check=False, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a = json.loads([x for x in proc.stdout.splitlines() if x.startswith("{")][-1])["warm_pool"]
    assert (a["records"], a["shards"], a["ok"], a["errors"]) == (3000, 3, 3000, 0)
    assert a["batches"] >= a["ideal_batches"] >= 1 and len(a["engine_busy_fraction"]) == 2
    assert a["efficiency"] > 0 and a["jobs_span_s"] <= a["wall_s"]
