"""bench/scale_ray.py for real: Ray Data in its own venv (``make ray-venv``) runs part (e)'s
workload and writes every record once, answered as the package's simulated engine answers it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest

from airflow_batchinfer.engines.base import GenerationRequest, SamplingParams
from airflow_batchinfer.engines.simulated import SimulatedEngine
from bench.scale import RAY_PYTHON, REPO, make_dataset

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not RAY_PYTHON.exists(), reason="Ray Data not installed: run make ray-venv"),
]


def test_ray_data_writes_every_record_once_with_the_simulated_engines_answer(tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    make_dataset(tmp_path, 3_000, 1, seed=3, sharded=False, single=data)
    out = tmp_path / "out"
    cmd = [str(RAY_PYTHON), str(REPO / "bench" / "scale_ray.py"), "--input", str(data), "--output", str(out)]
    cmd += ["--batch-size", "142", "--a", "0", "--b", "0"]  # no sleep: the test checks the data path
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": ""}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads([x for x in proc.stdout.splitlines() if x.startswith("{")][-1])
    assert figures["rows_out"] == 3_000 and figures["actors"] == 2 and figures["num_cpus"] == 4

    source = {r["id"]: r["text"] for r in map(json.loads, data.read_text().splitlines())}
    rows = [json.loads(x) for path in sorted(out.glob("*.json*")) for x in path.read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == sorted(source)  # each once
    sample = rows[:50]
    engine = SimulatedEngine(latency_base_s=0, latency_per_token_s=0, completion_tokens=0)
    requests = [
        GenerationRequest(str(r["id"]), prompt=source[r["id"]], sampling=SamplingParams(max_tokens=1))
        for r in sample
    ]
    expected = asyncio.run(engine.generate(requests))
    assert [r["result"] for r in sample] == [e.text for e in expected]
    assert all(r["text"] == source[r["id"]] for r in rows)
