"""Worker start-up benchmark (printed, not asserted), SIMULATED engine (no model to load): how long a
local pool takes from being asked for N workers to every worker answering ``/v1/ready`` (issue 24).

Side by side in one run:

- time to ready for 1 and 2 workers through the local pool backend (``LocalPool.start``, the call
  ``pool_setup`` makes, then ``LocalPool.up``'s wait, the pool's own readiness poll), split by the
  marks each worker writes into its announcement file (``startup``): spawned (the parent's
  ``Popen`` returned) → Python and the imports done → the app built → the engine loaded → listening
  → announced → ready seen by the poller, in ms from the request; a worker from before those marks
  is read from its log instead (the "worker listening" and "engine ready" lines, ms resolution);
- what ``batchinfer worker serve --engine simulated`` imports before it serves (``python -X
  importtime``, run to its announcement): the total, the heaviest packages, and whether it loads a
  module the worker side must not (airflow, torch, vllm, boto3, kubernetes).

The DAG adds to this what Airflow costs (the task's start; on a cold pool the setup task defers and
its trigger settles and polls): this measures the workers and the pool only.
Run: ``python bench/worker_start.py [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from airflow_batchinfer.pools import LocalPool, LocalPoolSpec  # noqa: E402

MARKS = ("spawned", "imports", "app", "engine", "listening", "announced", "ready")
FORBIDDEN = ("airflow", "torch", "vllm", "boto3", "botocore", "kubernetes", "transformers")
NOTABLE = ("fastapi", "uvicorn", "pydantic", "httpx", "fsspec", "jinja2", "zstandard", "orjson", "anyio")
# the log line (format of worker/server.py) a worker without startup marks says it listens with
LISTENING = "worker listening on"
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")


def _log_time(line: str) -> float | None:
    m = _STAMP.match(line)
    if m is None:
        return None
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + int(m.group(2)) / 1000


def worker_marks(worker: dict[str, Any]) -> dict[str, float]:
    """The wall-clock marks one worker left: its announcement's ``startup`` when it writes one, else
    what its log lines and the announcement's ``started_at`` tell."""
    doc = json.loads(Path(worker["announce"]).read_text())
    if isinstance(doc.get("startup"), dict):
        return {k: float(v) for k, v in doc["startup"].items() if k in MARKS}
    marks = {"announced": float(doc["started_at"])}
    for line in Path(worker["log"]).read_text(errors="replace").splitlines():
        t = _log_time(line)
        if t is None:
            continue
        if LISTENING in line:
            marks["listening"] = t
        elif "engine " in line and line.rstrip().endswith(" ready"):
            marks["engine"] = t
    return marks


def one_start(work: Path, replicas: int, trial: int) -> dict[str, float | None]:
    """Start ``replicas`` workers on a fresh pool; each mark in ms from the request (the latest of the
    workers: the pool is ready when its last worker is)."""
    pool = LocalPool(f"start-{replicas}-{trial}", state_dir=work / "pools")
    spec = LocalPoolSpec(engine="simulated", replicas=replicas, allowed_prefixes=(str(work),), idle_ttl_s=120)
    try:
        t0 = time.time()
        pool.start(spec)  # what pool_setup does: spawn, without waiting
        spawned = time.time()
        pool.up(spec)  # the pool's own readiness wait (announcement, then /v1/ready)
        ready = time.time()
        workers = json.loads(pool.state_file.read_text())["generations"][spec.key()]["workers"]
        per_worker = [worker_marks(w) for w in workers]
    finally:
        pool.down()
    out: dict[str, float | None] = {"spawned": spawned, "ready": ready}
    for mark in MARKS[1:-1]:
        values = [m[mark] for m in per_worker if mark in m]
        out[mark] = max(values) if len(values) == len(per_worker) else None
    return {k: None if v is None else round(1000 * (v - t0), 1) for k, v in out.items()}


def median_marks(runs: list[dict[str, float | None]]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for mark in MARKS:
        values = [r[mark] for r in runs if r.get(mark) is not None]
        out[mark] = round(statistics.median(values), 1) if values else None  # type: ignore[type-var]
    return out


def import_profile(work: Path) -> dict[str, Any]:
    """``-X importtime`` of a real ``batchinfer worker serve --engine simulated``, until it announces."""
    announce = work / "importtime.json"
    cmd = [sys.executable, "-X", "importtime", "-m", "airflow_batchinfer.cli", "worker", "serve",
           "--engine", "simulated", "--insecure-no-auth", "--allow-prefix", str(work),
           "--announce-file", str(announce)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # cwd: not the checkout, which `-m` would put first on sys.path (over $PYTHONPATH)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=work
    )
    deadline = time.monotonic() + 120
    try:
        while not announce.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)  # no job: the drain ends at once
        _, err = proc.communicate(timeout=60)
    rows = []  # (name as indented by its depth, own us, cumulative us)
    for line in err.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        own, cumulative, name = line.removeprefix("import time:").split("|", 2)
        rows.append((name[1:].rstrip(), int(own), int(cumulative)))
    top_level = [(n, cum) for n, _, cum in rows if not n.startswith(" ")]
    loaded = {n.strip() for n, _, _ in rows}
    by_package: dict[str, int] = {}
    for name, self_us, _ in rows:
        root = name.strip().split(".")[0]
        by_package[root] = by_package.get(root, 0) + self_us
    heavy = sorted(by_package.items(), key=lambda kv: -kv[1])[:10]
    return {
        "import_ms": round(sum(c for _, c in top_level) / 1000, 1),
        "modules": len(loaded),
        "heaviest_ms": {k: round(v / 1000, 1) for k, v in heavy},
        "notable_loaded": [m for m in NOTABLE if m in loaded],
        "forbidden_loaded": sorted(m for m in loaded if m.split(".")[0] in FORBIDDEN),
        "package_modules": sum(1 for m in loaded if m.startswith("airflow_batchinfer")),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="starts per pool size; medians printed")
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bi-start-bench-"))
    results: dict[str, Any] = {"load_avg_before": round(os.getloadavg()[0], 2)}
    try:
        for n in args.replicas:
            runs = [one_start(work, n, i) for i in range(args.repeats)]
            results[f"workers_{n}"] = median_marks(runs)
            results[f"workers_{n}_ready_ms_all"] = [r["ready"] for r in runs]
        results["imports"] = import_profile(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["load_avg_after"] = round(os.getloadavg()[0], 2)

    print(f"\nlocal pool, SIMULATED engine: ms from the request to each mark (median of {args.repeats};")
    print("the latest worker's; '-' where the worker leaves no such mark)")
    print(f"  {'workers':>7} " + " ".join(f"{m:>10}" for m in MARKS))
    for n in args.replicas:
        row = results[f"workers_{n}"]
        print(f"  {n:>7} " + " ".join(f"{'-' if row[m] is None else row[m]:>10}" for m in MARKS))
    for n in args.replicas:
        print(f"  ready, every run ({n} workers): {results[f'workers_{n}_ready_ms_all']}")
    imp = results["imports"]
    print(f"\n`batchinfer worker serve --engine simulated` imports (-X importtime): {imp['import_ms']} ms, "
          f"{imp['modules']} modules ({imp['package_modules']} of the package)")  # fmt: skip
    print("  heaviest packages (own time, ms): "
          + ", ".join(f"{k} {v}" for k, v in imp["heaviest_ms"].items()))  # fmt: skip
    print(f"  loaded before serving: {', '.join(imp['notable_loaded']) or 'none of ' + ', '.join(NOTABLE)}")
    print(f"  forbidden on the worker side: {', '.join(imp['forbidden_loaded']) or 'none'}")
    print(f"load average {results['load_avg_before']} -> {results['load_avg_after']} ({os.cpu_count()} CPUs)")
    print(json.dumps({"bench": "worker_start", **results}))


if __name__ == "__main__":
    main()
