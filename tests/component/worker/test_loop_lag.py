"""The event loop that feeds the engine never waits on a job's CPU work: an infer job over a shard
of large records (decoding, prompt rendering, row building, encoding and zstd compression all heavy)
leaves a 10 ms sleeper on the same loop on time, and none of that work runs on the loop's thread.

A correctness check with a generous bound, not a timing benchmark (bench/scale.py measures)."""

from __future__ import annotations

import asyncio
import base64
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.engines import create_engine
from airflow_batchinfer.prompts.build import PromptBuilder
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.state.params import parse_params
from airflow_batchinfer.storage import JsonlFile
from airflow_batchinfer.storage import reader as reader_module
from airflow_batchinfer.storage import writer as writer_module
from airflow_batchinfer.storage.records import parse_record
from airflow_batchinfer.worker.jobs import infer
from airflow_batchinfer.worker.registry import JobRegistry
from airflow_batchinfer.worker.runtime import Runtime

RECORDS = 240
TEXT_CHARS = 64 * 1024  # base64 of random bytes: ~15 MB of JSON that compresses poorly
MAX_LAG_S = 0.25  # a sleeper 10 ms apart; one chunk's work done on the loop stalls it far longer


def big_shard(tmp_path: Path) -> str:
    rng = random.Random(7)
    uri = str(tmp_path / "input" / "part-00000.jsonl.zst")
    with JsonlFile(uri).writer_sync() as w:
        w.write_many(
            {"id": i, "text": base64.b64encode(rng.randbytes(TEXT_CHARS * 3 // 4)).decode()}
            for i in range(RECORDS)
        )
    return uri


def on_loop_thread(
    monkeypatch: pytest.MonkeyPatch, seen: dict[str, list[bool]], loop_thread: list[int]
) -> None:
    """Record, for each heavy step, whether it ran on the event loop's thread."""

    def spy(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            seen.setdefault(name, []).append(threading.get_ident() in loop_thread)
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(reader_module, "parse_record", spy("decode", parse_record))
    monkeypatch.setattr(PromptBuilder, "build", spy("render", PromptBuilder.build))
    monkeypatch.setattr(infer, "output_row", spy("row", infer.output_row))
    monkeypatch.setattr(writer_module, "serialize", spy("encode", writer_module.serialize))
    monkeypatch.setattr(
        writer_module.JsonlWriter, "_flush", spy("compress", writer_module.JsonlWriter._flush)
    )


@pytest.mark.slow
def test_infer_job_on_large_records_leaves_the_loop_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = big_shard(tmp_path)
    seen: dict[str, list[bool]] = {}
    loop_thread: list[int] = []
    on_loop_thread(monkeypatch, seen, loop_thread)
    layout = RunLayout(str(tmp_path / "run"))
    spec = JobSpec(
        job_id="big",
        kind="infer",
        input=uri,
        outputs={"inferred": layout.inferred(0, "big"), "manifest": layout.job_manifest(0, "big", "infer")},
        params={"prompt_template": "Summarize: {{ text }}", "chunk_size": 60, "input_records": RECORDS},
    )

    async def main() -> list[float]:
        loop_thread.append(threading.get_ident())
        runtime = Runtime(create_engine("simulated", latency_base_s=0.001, latency_per_token_s=0.0))
        await runtime.start()
        registry = JobRegistry(runtime, concurrency=2)
        lags: list[float] = []
        try:
            registry.submit(spec, parse_params(spec.kind, spec.params))
            job = registry.jobs[spec.job_id]
            assert job.task is not None
            while not job.task.done():
                t0 = time.perf_counter()
                await asyncio.sleep(0.01)
                lags.append(time.perf_counter() - t0 - 0.01)
            await job.task
            assert job.state == "succeeded", job.error
        finally:
            await runtime.close()
        return lags

    lags = asyncio.run(main())
    print(f"loop lag: max {max(lags) * 1e3:.1f} ms, median {sorted(lags)[len(lags) // 2] * 1e3:.2f} ms")
    monkeypatch.undo()  # the checks below read on this thread, which ran the loop
    rows = list(JsonlFile(layout.inferred(0, "big")).iter_records())
    assert [r["id"] for r in rows] == list(range(RECORDS))  # every record, in order
    assert all(r["status"] == "ok" and len(r["text"]) == TEXT_CHARS for r in rows)
    for step in ("decode", "render", "row", "encode", "compress"):
        assert seen.get(step), f"{step} never ran"
        assert not any(seen[step]), f"{step} ran on the event loop's thread"
    assert len(lags) > 10
    assert max(lags) < MAX_LAG_S, f"the loop stalled {max(lags) * 1e3:.0f} ms (lags: {sorted(lags)[-5:]})"
