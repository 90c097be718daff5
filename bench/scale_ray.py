"""Part (e)'s peer: the scale workload on Ray Data, SIMULATED engine: printed, not asserted.

Runs in its own environment (``make ray-venv``: ``.cache/ray-venv``, Ray is no dependency of the
package), started by ``bench/scale.py --parts e`` as a subprocess; it imports nothing of
``airflow_batchinfer``. The shape of a Ray Data batch-inference job:

    read_json(the JSONL, lines=True) -> map_batches(Engine, ActorPoolStrategy(size=--actors),
    batch_size=--batch-size) -> write_json(out)

Each actor is one simulated GPU: Ray runs one call at a time per actor, and a call takes exactly
what the package's simulated engine takes for the batch (``airflow_batchinfer/engines/simulated.py``
with ``completion_tokens = 0``): ``a + b · Σ (len(text) // 4 + 1)``, counted from the call (building
the results is inside that time, not added to it). Ray starts inside the clock: ``ray.init`` (a
local cluster on 127.0.0.1, no dashboard, no usage stats) and the actors' start-up are counted, as in
the issue's figure; ``import ray`` is timed apart. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # before ray is imported: no usage report


def answer(prompt: str, attempt: int = 1) -> str:
    """The simulated engine's answer text: a hash of the prompt and the attempt."""
    return hashlib.sha256(f"{prompt}\x1f{attempt}".encode()).hexdigest()[:16]


class Engine:
    """One simulated GPU: a batch's results after ``a + b·tokens`` seconds."""

    def __init__(self, a: float, b: float) -> None:
        self.a, self.b = a, b

    def latency_s(self, prompts: list[str]) -> float:
        """The simulated engine's batch latency (``completion_tokens`` 0): ``a + b ·`` its prompt
        tokens, ``len // 4 + 1`` each."""
        return self.a + self.b * sum(len(p) // 4 + 1 for p in prompts)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        due = time.monotonic()
        texts = [str(t) for t in batch["text"]]
        due += self.latency_s(texts)
        batch["result"] = [f"simulated answer {answer(t)}" for t in texts]
        time.sleep(max(0.0, due - time.monotonic()))
        return batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True, help="the JSONL file (part (a)/(b)'s dataset)")
    parser.add_argument("--output", required=True, help="a folder for the output JSONL files")
    parser.add_argument("--actors", type=int, default=2, help="simulated GPUs: one actor each")
    parser.add_argument("--batch-size", type=int, required=True, help="records per engine batch")
    parser.add_argument("--a", type=float, default=0.005, help="engine latency per batch, s")
    parser.add_argument("--b", type=float, default=2e-6, help="engine latency per prompt token, s")
    parser.add_argument(
        "--num-cpus", type=int, default=None,
        help="Ray's logical CPUs (default: one per actor, plus 2 for the read and write tasks)",
    )  # fmt: skip
    parser.add_argument("--object-store-mb", type=int, default=2048)
    args = parser.parse_args()
    num_cpus = args.num_cpus or args.actors + 2  # an actor holds 1 CPU; reads and writes need their own

    t_import = time.perf_counter()
    import ray
    import ray.data

    import_s = time.perf_counter() - t_import

    t0 = time.perf_counter()
    ray.init(
        num_cpus=num_cpus,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",  # loopback only
        object_store_memory=args.object_store_mb * 2**20,
        log_to_driver=False,
        configure_logging=False,
    )
    init_s = time.perf_counter() - t0
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    ds = ray.data.read_json(args.input, lines=True)
    ds = ds.map_batches(
        Engine,
        fn_constructor_kwargs={"a": args.a, "b": args.b},
        batch_size=args.batch_size,
        compute=ray.data.ActorPoolStrategy(size=args.actors),
        num_cpus=1,
    )
    ds.write_json(args.output)
    wall = time.perf_counter() - t0
    t1 = time.perf_counter()
    ray.shutdown()
    shutdown_s = time.perf_counter() - t1

    rows = 0
    files = sorted(Path(args.output).glob("*.json*"))
    for path in files:
        with path.open("rb") as f:
            rows += sum(1 for _ in f)
    print(
        json.dumps(
            {
                "ray": ray.__version__,
                "actors": args.actors,
                "num_cpus": num_cpus,
                "batch_size": args.batch_size,
                "import_s": round(import_s, 2),
                "init_s": round(init_s, 2),
                "wall_s": round(wall, 2),  # ray.init -> the outputs written
                "shutdown_s": round(shutdown_s, 2),
                "rows_out": rows,
                "files_out": len(files),
            }
        )
    )


if __name__ == "__main__":
    main()
