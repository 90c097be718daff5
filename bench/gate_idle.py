"""What a review gate idles: ``gate_idle: keep`` vs ``release`` (printed, not asserted), SIMULATED engine.

Per policy, one run of the pipeline DAG (two rounds, a review gate before the second answered
``Continue`` after ``--answer-after`` seconds, then the tail's gate ``Stop``) on a real local
Airflow, each on its own local pool of ``--replicas`` workers. ``release`` keeps its lease
``--gate-keep-warm-s``, then gives it back, and the pool's workers exit after its ``--idle-ttl-s``;
the answer re-warms the pool. Side by side, from each run's report (``usage``:
:mod:`airflow_batchinfer.run.usage`): GPU-seconds leased and idle at the gates (a CPU pool's
replica counts as one GPU), what ``keep`` would have leased, re-warm seconds, the run's wall time,
and whether every input id is accounted for once (the report's invariant, and no id twice in the
results).

Needs the run settings ``gate_idle`` and ``gate_keep_warm_s`` (issue 40): it stops with a message
in a tree without them.

Run: ``python bench/gate_idle.py [--answer-after 20 --records 40]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from airflow_batchinfer.spec.settings import BY_NAME  # noqa: E402

POLICIES = ("keep", "release")
NEEDED = ("gate_idle", "gate_keep_warm_s")
DAG = """
from datetime import timedelta
from airflow_batchinfer.dag_factory import build_batch_inference_dag
build_batch_inference_dag("gate_{policy}", max_rounds=2, airflow_pool="bench", defaults={defaults!r},
                          retries=1, retry_delay=timedelta(seconds=1))
"""
COLUMNS = (
    ("wall s", "wall_s"),
    ("leased GPU-s", "leased_gpu_s"),
    ("idle at gates GPU-s", "idle_gates_gpu_s"),
    ("keep would lease", "keep_gpu_s"),
    ("saved GPU-s", "saved_gpu_s"),
    ("re-warm s", "rewarm_s"),
    ("ids once", "ids_once"),
)


def missing_settings(known: set[str]) -> list[str]:
    """The settings this bench needs that the tree does not have."""
    return [n for n in NEEDED if n not in known]


def side_by_side(results: dict[str, dict[str, Any]]) -> list[str]:
    """The policies' figures as a table: a row per figure, a column per policy."""
    policies = list(results)
    lines = [f"{'':<21}" + "".join(f"{p:>14}" for p in policies)]
    for label, key in COLUMNS:
        cells = [results[p].get(key) for p in policies]
        lines.append(f"{label:<21}" + "".join(f"{'–' if c is None else c!s:>14}" for c in cells))
    return lines


def figures(root: Path, wall_s: float, state: str) -> dict[str, Any]:
    """One run's figures, from its report and results."""
    from airflow_batchinfer.storage import JsonlDir

    report = json.loads((root / "report" / "summary.json").read_text())
    usage = report.get("usage") or {}
    ids = Counter(r["id"] for f in JsonlDir(str(root / "results")).jsonl_files() for r in f.iter_records())
    return {
        "state": state,
        "wall_s": round(wall_s, 1),
        **{
            k: usage.get(k)
            for k in ("leased_gpu_s", "idle_gates_gpu_s", "keep_gpu_s", "saved_gpu_s", "rewarm_s")
        },
        "warms": [{"seconds": w["seconds"], "workers": w["workers"]} for w in usage.get("warms", [])],
        "usage_known": usage.get("known"),
        "ids_once": bool(report["invariant"]["ok"]) and all(n == 1 for n in ids.values()),
    }


def answer(detail: dict[str, Any]) -> str:
    """``Continue`` at the gate before round 1; ``Stop`` at the tail's (it offers no Continue)."""
    return "Continue" if "Continue" in detail.get("options", []) else "Stop"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--answer-after", type=float, default=20.0, help="seconds before the gate is answered")
    ap.add_argument("--records", type=int, default=40)
    ap.add_argument("--records-per-shard", type=int, default=10)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--gate-keep-warm-s", type=float, default=3.0)
    ap.add_argument(
        "--idle-ttl-s", type=float, default=2.0, help="the pool's: workers exit this long after release"
    )
    ap.add_argument("--job-seconds", type=float, default=0.5, help="simulated batch latency")
    ap.add_argument(
        "--load-s", type=float, default=10.0, help="the simulated engine's model load (each start pays it)"
    )
    ap.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    args = ap.parse_args()
    if missing := missing_settings(set(BY_NAME)):
        sys.exit(
            f"bench/gate_idle.py: this tree has no run setting {', '.join(missing)} (issue 40's gate "
            "policy, branch i40-gate): merge it, then run this bench again"
        )
    from airflow_batchinfer.dev.airflow import DevAirflow
    from airflow_batchinfer.pools import LocalPool

    work = Path(tempfile.mkdtemp(prefix="bench-gate-idle-"))
    data = work / "data.jsonl"
    data.write_text(
        "".join(json.dumps({"id": f"r{i:05d}", "question": f"q {i}"}) + "\n" for i in range(args.records))
    )
    (work / "dags").mkdir()
    engine_options = {"approval_rate": 0.5, "latency_base_s": args.job_seconds, "load_s": args.load_s}
    for policy in args.policies:
        defaults = {
            "input": str(data), "output_root": str(work / "runs"), "run_name": policy, "engine": "simulated",
            "model": None, "engine_options": engine_options,
            "prompt_template": "{{ question }}", "judge": {"type": "llm"},
            "records_per_shard": args.records_per_shard, "chunk_size": args.records_per_shard,
            "worker_pool": f"local://gate-{policy}", "replicas": args.replicas, "concurrency": 1,
            "idle_ttl_s": args.idle_ttl_s, "preflight_records": 0, "review": "every_round",
            "gate_idle": policy, "gate_keep_warm_s": args.gate_keep_warm_s,
        }  # fmt: skip
        (work / "dags" / f"gate_{policy}.py").write_text(DAG.format(policy=policy, defaults=defaults))
    os.environ["BATCHINFER_CACHE"] = str(work / "cache")
    env = {"BATCHINFER_CACHE": str(work / "cache")}
    results: dict[str, dict[str, Any]] = {}
    af = DevAirflow(home=work / "airflow", dags_folder=work / "dags", parallelism=8, env=env)
    try:
        af.start(pools={"bench": args.replicas * 2})
        for policy in args.policies:  # one after the other: each on its own pool, nothing shared
            dag_id = f"gate_{policy}"
            af.wait_for_dag(dag_id)
            t0 = time.monotonic()
            run_id = af.trigger(dag_id)
            state = af.wait_run(
                dag_id,
                run_id,
                timeout_s=1800,
                on_review=answer,
                review_delay_s=args.answer_after,
            )
            results[policy] = figures(work / "runs" / policy, time.monotonic() - t0, state)
    finally:
        af.stop()
        for policy in args.policies:  # a run cut short leaves its lease: its workers would wait it out
            LocalPool(f"gate-{policy}").down()
    print(
        f"review gate idle, SIMULATED engine: {args.records} records, 2 rounds, gate answered after "
        f"{args.answer_after:g} s; pool of {args.replicas} workers (a replica counts as 1 GPU), "
        f"gate_keep_warm_s {args.gate_keep_warm_s:g}, idle_ttl_s {args.idle_ttl_s:g}, simulated model load "
        f"{args.load_s:g} s"
    )
    print("\n".join(side_by_side(results)))
    for policy, r in results.items():
        for w in r["warms"]:
            print(f"{policy}: re-warm {w['seconds']} s: {w['workers']}")
    print(json.dumps({"bench": "gate_idle", "answer_after_s": args.answer_after, **results}))


if __name__ == "__main__":
    main()
