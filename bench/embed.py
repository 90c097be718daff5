"""Embed benchmark (printed, not asserted): an OpenAI batch file of ``/v1/embeddings`` requests through
a worker (``task: embed``, ``output_format: openai``: the shard read, the batcher, vLLM's pooling
runner, the lines written) against ``vllm run-batch`` on the same file, in the same run, one after the
other (never both at once), with the same engine settings.

The model: SmolLM2-135M's weights as a bare ``LlamaModel`` with a sentence-transformers mean pooling
(``--model smollm2``, the default: a 135M embedder, 576 dimensions), or the tiny random Llama
(``--model tiny``), built offline. Each side's wall includes loading the model (``run-batch`` loads it
in the same process); ours is also given for the job alone, and run-batch's run alone from its
progress bar. Both answer the same ids; the vectors of the two sides are compared (the largest
difference of a value). ``--engines vllm,transformers`` adds our worker on the transformers engine
(the GPU form of this benchmark: ``--device cuda``), whose vectors are compared with vLLM's too.

Both sides go through the run-batch harness (:mod:`airflow_batchinfer.dev.run_batch`).

Run: ``python bench/embed.py [--records 512] [--model smollm2|tiny]`` (needs ``make vllm-venv models``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from airflow_batchinfer.dev.run_batch import VLLM_ENV, BatchRun, vllm_run_batch, worker_batch  # noqa: E402
from airflow_batchinfer.dev.tiny_llama import build_tiny_embedder, build_tiny_llama  # noqa: E402
from airflow_batchinfer.dev.workers import start_worker  # noqa: E402
from airflow_batchinfer.engines.pooling import decode_vector  # noqa: E402

VLLM_PYTHON = REPO / ".cache" / "vllm-venv" / "bin" / "python"
ENV = {**VLLM_ENV, "VLLM_CPU_KVCACHE_SPACE": "2", "OMP_NUM_THREADS": "2"}
ENGINE_ARGS: dict[str, Any] = {"max_model_len": 512, "dtype": "float32", "enforce_eager": True}
SERVED = "embedder"
TEXT = (
    "the quick brown fox jumps over the lazy dog while a model reads every record of the batch once "
    "and writes one vector for each of them so that search and clustering can use them later on"
)
WORDS = TEXT.split(" ")


def smollm2_embedder(dst: Path) -> Path:
    """SmolLM2-135M-Instruct's weights as a bare LlamaModel with mean pooling (a 135M embedder)."""
    import torch
    from transformers import AutoTokenizer, LlamaModel

    from airflow_batchinfer.engines.models import prepare_smollm2

    src = prepare_smollm2(REPO / ".cache")
    model = LlamaModel.from_pretrained(str(src), local_files_only=True, dtype=torch.float32)
    model.config.architectures = ["LlamaModel"]
    model.save_pretrained(dst, safe_serialization=True)
    AutoTokenizer.from_pretrained(str(src), local_files_only=True).save_pretrained(dst)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (dst / "modules.json").write_text(json.dumps(modules))
    (dst / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": model.config.hidden_size, "pooling_mode_mean_tokens": True}
    (dst / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return dst


def batch_file(path: Path, n: int, words: int) -> None:
    """``n`` ``/v1/embeddings`` requests of about ``words`` words each, every text its own."""
    with path.open("w") as f:
        for i in range(n):
            text = " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(words)) + f" record {i}"
            body = {"model": SERVED, "input": text}
            f.write(
                json.dumps({"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings", "body": body})
            )
            f.write("\n")


def vectors(lines: Mapping[str, Mapping[str, Any]]) -> dict[str, list[float]]:
    out = {}
    for cid, line in lines.items():
        body = (line.get("response") or {}).get("body") or {}
        if body.get("data"):
            value = body["data"][0]["embedding"]
            out[cid] = decode_vector(value) if isinstance(value, str) else list(value)
    return out


def ours(tmp: Path, engine: str, model: str, src: Path, device: str) -> BatchRun:
    """``src`` through an embed job on a worker of ``engine``: ``wall_s`` the worker's start, the job
    and its stop; ``run_s`` the job alone."""
    t0 = time.monotonic()
    vllm = engine == "vllm"
    w = start_worker(
        tmp / f"worker-{engine}",
        engine=engine,
        model=model,
        python=str(VLLM_PYTHON) if vllm else None,
        concurrency=2,
        allow=[str(tmp)],
        engine_args=dict(ENGINE_ARGS) if vllm else {"device": device},
        env=ENV,
        timeout=900,
    )
    try:
        job = worker_batch(w, src, tmp, name=f"embed-{engine}", params={"task": "embed"}, timeout=3600)
    finally:
        w.stop()
    return replace(job, wall_s=time.monotonic() - t0)


def largest_difference(a: Mapping[str, list[float]], b: Mapping[str, list[float]]) -> float | None:
    shared = set(a) & set(b)
    if not shared:
        return None
    return max(abs(x - y) for cid in shared for x, y in zip(a[cid], b[cid], strict=True))


def row(name: str, side: BatchRun, n: int) -> str:
    run = side.run_s
    per = f"{n / run:8.1f}" if run else "       -"
    tok = f"{side.prompt_tokens / run:10.0f}" if run else "         -"
    ok = len(vectors(side.lines))
    return f"{name:<26} {side.wall_s:8.1f} {run or 0:8.1f} {per} {tok} {ok:>6}/{n}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=512)
    ap.add_argument("--words", type=int, default=48, help="about this many words a text")
    ap.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    ap.add_argument(
        "--engines", default="vllm", help="our worker's engines: vllm, transformers (comma-separated)"
    )
    ap.add_argument("--device", default="cpu", help="the transformers engine's device (cuda on a GPU)")
    ap.add_argument("--no-run-batch", action="store_true", help="our side only")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-embed-") as d:
        tmp = Path(d)
        if args.model == "tiny":
            model = str(build_tiny_embedder(build_tiny_llama(tmp / "tiny-llama"), tmp / "tiny-embedder"))
        else:
            model = str(smollm2_embedder(tmp / "smollm2-embedder"))
        src = tmp / "embeddings.jsonl"
        batch_file(src, args.records, args.words)
        sides: dict[str, BatchRun] = {}
        for engine in args.engines.split(","):
            sides[f"ours ({engine})"] = ours(tmp, engine, model, src, args.device)
        if not args.no_run_batch:
            sides["vllm run-batch"] = vllm_run_batch(
                src, tmp / "run-batch-out.jsonl", python=VLLM_PYTHON, model=model, served_model_name=SERVED,
                engine_args=ENGINE_ARGS, env=ENV, timeout=3600,
            )  # fmt: skip
        n = args.records
        print(f"embed: {n} /v1/embeddings requests (~{args.words} words), model {args.model} ({model})")
        print(f"{'side':<26} {'wall s':>8} {'run s':>8} {'rec/s':>8} {'prompt tok/s':>10} {'vectors':>8}")
        for name, side in sides.items():
            print(row(name, side, n))
        names = list(sides)
        figures: dict[str, Any] = {"bench": "embed", "records": n, "model": args.model, "sides": {}}
        for name, side in sides.items():
            figures["sides"][name] = {
                "wall_s": side.wall_s,
                "run_s": side.run_s,
                "tokens": side.prompt_tokens,
            }
        for other in names[1:]:
            diff = largest_difference(vectors(sides[names[0]].lines), vectors(sides[other].lines))
            same = set(sides[names[0]].lines) == set(sides[other].lines)
            print(f"{names[0]} vs {other}: same ids {same}; largest difference of a vector value {diff}")
            figures["sides"][other].update(same_ids=same, largest_difference=diff)
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
