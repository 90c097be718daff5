"""Calibration benchmark (printed, not asserted): what the calibration of the judge against people
reports on a run whose judge is known to be wrong on a share of the rows.

The run is real but for its model: ``--records`` records on ``--workers`` worker processes (the
SIMULATED engine, over HTTP, lanes as ``batchinfer run`` runs them), judged by a ``callable`` judge
built to err (:mod:`airflow_batchinfer.dev.calibration`: each answer right with probability 0.7; the judge
wrong with probability ``2 · 0.2 · (1 - score)``, 20% of the rows on average, most at low scores),
``spot_check_approved: --spot-checks``. At each review gate a scripted reviewer who knows the truth
decides on the review desk's HTTP API (Airflow's api-server app in process, on SQLite): every spot
check, and a seeded ``--review-share`` of the other rows on the desk, accept a right answer, retry a
wrong one; the gate is answered Continue (the last one Stop), which stores the round's calibration.

Printed per reviewed round: the calibration's agreement, Cohen's kappa, precision and recall of
"approve" (estimated from the reviewed rows, each weighed by its stratum), beside the same figures
of the round's judged rows counted directly from the construction, and beside what the construction
implies on average; then the agreement per score bucket, estimated and implied. One JSON line last.

Run: ``python bench/calibration.py [--records 4000] [--spot-checks 200] [--review-share 0.5]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from airflow_batchinfer.dev import calibration as c  # noqa: E402
from airflow_batchinfer.dev.desk import answer_gate, desk_app, open_gate  # noqa: E402
from airflow_batchinfer.dev.workers import TOKEN, start_worker  # noqa: E402
from airflow_batchinfer.rpc.pool import PoolClient  # noqa: E402
from airflow_batchinfer.run.close import close_round  # noqa: E402
from airflow_batchinfer.run.lanes import Lane, clear_claims, lane_count, run_lane  # noqa: E402
from airflow_batchinfer.run.plan import CONTINUE, STOP, apply_choice, propose_slot  # noqa: E402
from airflow_batchinfer.run.prepare import prepare_run  # noqa: E402
from airflow_batchinfer.state.config import RunConfig  # noqa: E402
from airflow_batchinfer.state.docs import Plan, slots, write_plan  # noqa: E402
from airflow_batchinfer.state.docs.calibration import Calibration, read_calibration  # noqa: E402
from airflow_batchinfer.state.layout import RunLayout  # noqa: E402
from airflow_batchinfer.storage import JsonlDir  # noqa: E402

RUN_ID = "calibration"
GATE_TASK = {"round-01": "round_01.plan", "tail": "tail.plan"}  # the desk tests' DAG has these two


async def run_round(pool: PoolClient, cfg: RunConfig, plan: Plan) -> None:
    """The round's shards by lanes, as ``batchinfer run`` runs them (one lane per worker slot)."""
    pools: dict[Any, PoolClient] = {k: pool for k in ("infer", "infer_judge", "in_place", "judge")}
    count = lane_count(0, 8, len(plan.shards))
    await asyncio.gather(
        *(run_lane(Lane(plan.slot, plan.round, i, count), cfg, plan, pools) for i in range(count))
    )


def judged_rows(layout: RunLayout, r: int) -> list[tuple[str, int]]:
    """The rows round ``r`` judged: ``(id, attempt)`` of its approved and rejected rows."""
    found = [
        f for f in JsonlDir(layout.results).jsonl_files() if Path(f.uri).name.startswith(f"round{r:02d}-")
    ]
    found += JsonlDir(layout.rejected_dir(r)).jsonl_files()
    return [(str(row["id"]), int(row["attempts"])) for f in found for row in f.iter_records()]


def row(label: str, fig: Any) -> str:
    return (
        f"| {label} | {fig.agreement:.3f} | {fig.kappa:.3f} | {fig.precision:.3f} | {fig.recall:.3f} |"
        if fig.kappa is not None
        else f"| {label} | {fig.agreement} | – | {fig.precision} | {fig.recall} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=4_000)
    ap.add_argument("--records-per-shard", type=int, default=500)
    ap.add_argument("--spot-checks", type=int, default=200, help="spot_check_approved")
    ap.add_argument("--review-share", type=float, default=0.5, help="share of the rejected rows reviewed")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-calibration-"))
    cfg = RunConfig.of(
        input=str(c.write_input(work / "data.jsonl", args.records)),
        run_root=str(work / "run"),
        prompt_template="{{ question }}",
        judge=c.JUDGE,
        records_per_shard=args.records_per_shard,
        max_rounds=2,
        spot_check_approved=args.spot_checks,
    )
    env = {"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    workers = [
        start_worker(
            work / f"w{i}",
            concurrency=4,
            allow=[str(work)],
            env=env,
            extra=["--allow-callable", c.JUDGE["target"]],
            engine_args={"latency_base_s": 0.002},
        )
        for i in range(args.workers)
    ]
    started = time.monotonic()
    try:
        rounds = asyncio.run(drive(cfg, [w.url for w in workers], work, args.review_share))
    finally:
        for w in workers:
            w.stop()
    report(args, rounds, RunLayout(cfg.run_root), time.monotonic() - started)


async def drive(cfg: RunConfig, urls: list[str], work: Path, share: float) -> list[dict[str, Any]]:
    """The run's slots as ``batchinfer run`` goes through them, but for its gates: there the
    scripted reviewer decides on the desk, then the gate is answered (the plan task's part)."""
    layout = RunLayout(cfg.run_root)
    pool = PoolClient(urls, token=TOKEN)
    rounds = []
    await asyncio.to_thread(prepare_run, cfg)
    with desk_app(work / "airflow") as desk:
        for slot in slots(cfg.retries.max_rounds):
            proposal = await asyncio.to_thread(propose_slot, cfg, slot)
            plan = proposal.plan
            if proposal.options:  # a gate: the reviewer decides on the desk, then it is answered
                r = plan.round - 1
                await asyncio.to_thread(open_gate, desk, RUN_ID, GATE_TASK[slot], cfg.run_root, f"round {r}")
                decided = await asyncio.to_thread(c.review_on_desk, desk, RUN_ID, rejected_share=share)
                url = f"/batchinfer/api/gates/desk/{RUN_ID}/calibration"
                live = (await asyncio.to_thread(desk.get, "bob", url)).json()
                choice = STOP if slot == "tail" else CONTINUE
                await asyncio.to_thread(answer_gate, RUN_ID, GATE_TASK[slot], choice)
                plan = await asyncio.to_thread(apply_choice, cfg, proposal, choice, by="review (alice)")
                doc = read_calibration(layout, r)
                assert doc is not None  # the figures stored at the answer are the desk's live ones
                assert {**doc.to_json(), "bulk": None} == {**live["calibration"], "bulk": None}
                rounds.append({"round": r, "decided": decided, "doc": doc})
            if plan.mode != "skip":
                plan.engine = await pool.engine()
            await asyncio.to_thread(write_plan, layout, plan)
            if plan.mode == "rounds":
                await asyncio.to_thread(clear_claims, layout, plan.round)
                await run_round(pool, cfg, plan)
                await asyncio.to_thread(close_round, cfg, plan)
    await pool.aclose()
    return rounds


def report(args: argparse.Namespace, rounds: list[dict[str, Any]], layout: RunLayout, wall: float) -> None:
    theory = c.theory()
    out: list[dict[str, Any]] = []
    print(
        f"\nCalibration on a run whose judge errs on {c.WRONG:.0%} of the rows on average (answers right: "
        f"{c.RIGHT:.0%}); {args.records} records, spot_check_approved {args.spot_checks}, "
        f"{args.review_share:.0%} of the other rows on the desk reviewed; {wall:.0f} s\n"
    )
    for entry in rounds:
        doc: Calibration = entry["doc"]
        counted = c.expected(judged_rows(layout, doc.round))
        print(
            f"round {doc.round}: {counted.rows} judged rows; {doc.reviewed} reviewed ({doc.spot_checks} spot "
            f"checks); coverage {doc.coverage}; notes: {'; '.join(doc.notes) or 'none'}\n"
        )
        print("| figures | agreement | kappa | precision | recall |")
        print("| --- | --- | --- | --- | --- |")
        print(row("calibration (estimated from the reviewed rows)", doc))
        print(row("the round's judged rows (counted from the construction)", counted))
        print(row("the construction on average", theory))
        print("\n| score from | judged rows | reviewed | agreement (estimated) | agreement (construction) |")
        print("| --- | --- | --- | --- | --- |")
        for b in doc.buckets:
            implied = c.bucket_agreement(b.bucket) if b.bucket != "none" else None
            est = "–" if b.agreement is None else f"{b.agreement:.3f}"
            print(f"| {b.bucket} | {b.rows} | {b.reviewed} | {est} | {implied:.3f} |")
        print()
        out.append(
            {
                "round": doc.round,
                "judged": counted.rows,
                "reviewed": doc.reviewed,
                "spot_checks": doc.spot_checks,
                "estimated": {k: getattr(doc, k) for k in ("agreement", "kappa", "precision", "recall")},
                "counted": dict(
                    zip(("agreement", "kappa", "precision", "recall"), counted.rounded(), strict=True)
                ),
                "construction": dict(
                    zip(("agreement", "kappa", "precision", "recall"), theory.rounded(), strict=True)
                ),
                "buckets": {b.bucket: b.agreement for b in doc.buckets},
            }
        )
    print(
        json.dumps({"bench": "calibration", "records": args.records, "wall_s": round(wall, 1), "rounds": out})
    )


if __name__ == "__main__":
    main()
