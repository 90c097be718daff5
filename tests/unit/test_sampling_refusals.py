"""No silent drops: a record whose body (or the job's sampling) asks for a field its engine does not
honour is that record's prompt error naming the record and the field; the job's ``sampling`` param is
refused when no engine honours a field (at submit and when the run starts) and, once the pool's
engine is known, when that engine does not; a job's fingerprint still covers what it asked for."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_batchinfer.engines.base import GenerationResult, SamplingParams
from airflow_batchinfer.exceptions import ConfigError, PromptError
from airflow_batchinfer.judges import build_judge
from airflow_batchinfer.prompts.build import PromptBuilder
from airflow_batchinfer.rpc.fingerprint import fingerprint, spec_key
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.params import parse_params
from airflow_batchinfer.worker.jobs.infer import openai_batch_row

CHAT = [{"role": "user", "content": "hi"}]


def body(**fields: Any) -> dict[str, Any]:
    return {"custom_id": "req-7", "body": {"messages": CHAT, **fields}}


def test_a_body_field_the_engine_does_not_honour_is_that_records_prompt_error() -> None:
    on_transformers = PromptBuilder(None, engine="transformers")
    with pytest.raises(PromptError) as refused:
        on_transformers.build(body(presence_penalty=0.5, temperature=0.3), request_id="req-7")
    why = str(refused.value)
    assert why.startswith("record 'req-7': body field presence_penalty=0.5 is refused")
    assert "transformers engine does not honour it" in why and "(vllm, openai, simulated)" in why
    # the engine that honours it gets it
    req = PromptBuilder(None, engine="vllm").build(body(presence_penalty=0.5), request_id="req-7")
    assert req.sampling.presence_penalty == 0.5
    # honoured on transformers: carried to the engine
    req = on_transformers.build(body(repetition_penalty=1.3, top_k=5, min_p=0.1), request_id="req-7")
    assert (req.sampling.repetition_penalty, req.sampling.top_k, req.sampling.min_p) == (1.3, 5, 0.1)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"best_of": 3}, "body field best_of=3"),
        ({"echo": True}, "body field echo=true"),
        ({"response_format": {"type": "json_schema"}}, "body field response_format"),
        ({"guided_json": {}}, "body field guided_json is not a field"),
        ({"temperature": "hot"}, 'body field temperature="hot"'),
        ({"min_tokens": 50, "max_tokens": 10}, "min_tokens 50 is above max_tokens 10"),
    ],
)
def test_what_no_engine_honours_is_refused_whatever_the_engine(fields: dict[str, Any], named: str) -> None:
    for engine in (None, "vllm", "simulated"):
        with pytest.raises(PromptError, match=r"^record 'req-7': ") as refused:
            PromptBuilder(None, engine=engine).build(body(**fields), request_id="req-7")
        assert named in str(refused.value), (engine, str(refused.value))


def test_no_op_and_neutral_body_fields_are_taken() -> None:
    b = PromptBuilder(None, engine="transformers")
    fields = {"model": "gpt-4o", "user": "u", "metadata": {"a": "b"}, "n": 1, "stream": False, "store": False}
    req = b.build(body(**fields), request_id="req-7")
    assert req.messages == CHAT and req.sampling == SamplingParams()


def test_each_records_fields_are_decided_on_their_own_values() -> None:
    """Decisions are remembered per distinct set of fields: ``1``, ``true`` and ``2`` stay apart."""
    b = PromptBuilder(None, engine="vllm")
    for value, refused in ((1, False), (True, True), (2, True), (1, False), ([1], True)):
        if refused:
            with pytest.raises(PromptError, match=r"body field best_of="):
                b.build(body(best_of=value), request_id="req-7")
        else:
            assert b.build(body(best_of=value), request_id="req-7").sampling == SamplingParams()
    assert b.build(body(n=2, temperature=0.5), request_id="r").sampling.n == 2  # honoured: its own value
    assert b.build(body(n=1), request_id="r").sampling.n == 1
    assert b.build(body(stop=["a"]), request_id="r").sampling.stop == ("a",)
    assert b.build(body(stop=["b"]), request_id="r").sampling.stop == ("b",)


def test_the_jobs_sampling_the_engine_does_not_honour_makes_every_record_an_error() -> None:
    params = {"prompt_template": "Q {{ q }}", "sampling": {"frequency_penalty": 0.4}}
    prompts = parse_params("infer", params, engine="transformers").prompts
    assert prompts is not None
    for record in ({"id": 1, "q": "x"}, body()):
        with pytest.raises(PromptError, match=r"the job's sampling\.frequency_penalty is refused"):
            prompts.build(record, request_id="1")
    # a body setting the field back to its default asks for nothing the engine lacks
    assert prompts.build(body(frequency_penalty=0), request_id="1").sampling.frequency_penalty == 0
    on_vllm = parse_params("infer", params, engine="vllm").prompts
    assert on_vllm is not None and on_vllm.build({"q": "x"}, request_id="1").sampling.frequency_penalty == 0.4


@pytest.mark.parametrize(
    ("sampling", "named"),
    [
        ({"best_of": 2}, "sampling.best_of=2 is refused"),
        ({"stream": True}, "sampling.stream=true"),
        ({"max_tokenz": 5}, "sampling.max_tokenz is not a field of the sampling param"),
        ({"messages": []}, "sampling.messages is part of a request"),
        ({"top_k": 2.5}, "sampling.top_k=2.5"),
    ],
)
def test_a_sampling_param_no_engine_runs_is_refused_at_submit_and_at_trigger(
    sampling: dict[str, Any], named: str
) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.").replace("[", r"\[")):
        parse_params("infer", {"prompt_template": "{{ q }}", "sampling": sampling}, engine="vllm")
    cfg = RunConfig.of(input="/d/in.jsonl", run_root="/d/run", prompt_template="{{ q }}",
                       judge={"type": "llm"}, sampling=sampling)  # fmt: skip
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        cfg.validate()


def test_the_run_is_refused_for_the_pools_engine_naming_field_and_engine() -> None:
    cfg = RunConfig.of(input="/d/in.jsonl", run_root="/d/run", prompt_template="{{ q }}",
                       judge={"type": "llm"}, sampling={"presence_penalty": 0.5, "top_k": 4})  # fmt: skip
    cfg.validate()  # some engine honours each field
    why = cfg.engine_refusal("transformers")
    assert why is not None and why.startswith("sampling.presence_penalty=0.5 is refused: the transformers")
    assert "top_k" not in why  # transformers honours top_k
    assert cfg.engine_refusal("vllm") is None and cfg.engine_refusal("openai") is None


def test_an_llm_judges_sampling_object_is_checked_too() -> None:
    with pytest.raises(ConfigError, match=r"llm judge: sampling\.echo=true is refused"):
        build_judge({"type": "llm", "sampling": {"echo": True}}, callables=None)
    judge = build_judge({"type": "llm", "sampling": {"repetition_penalty": 1.1}}, callables=None)
    assert judge.describe()["sampling"]["repetition_penalty"] == 1.1  # type: ignore[attr-defined]


def test_openai_output_rows_have_openai_choices_and_usage() -> None:
    res = GenerationResult("4", None, 12, 3, "stop")
    chat = openai_batch_row(body(), res, model="m", created=1)
    b = chat["response"]["body"]
    assert set(chat) == {"id", "custom_id", "response", "error"} and chat["error"] is None
    assert b["object"] == "chat.completion" and b["system_fingerprint"] is None
    assert b["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "4"},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    assert b["usage"] == {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
    text = openai_batch_row({"custom_id": "c", "body": {"prompt": "2+2="}}, res, model="m", created=1)
    tb = text["response"]["body"]
    assert tb["object"] == "text_completion"
    assert tb["choices"] == [{"index": 0, "text": "4", "logprobs": None, "finish_reason": "stop"}]
    failed = openai_batch_row(
        body(), GenerationResult.failed("record 'req-7': body field n=2"), model="m", created=1
    )
    assert failed["response"] is None and "n=2" in failed["error"]["message"]


SPEC = {
    "job_id": "r-0-infer-x", "kind": "infer", "input": "/d/in.jsonl",
    "outputs": {"inferred": "/d/out.jsonl", "manifest": "/d/m.json"},
}  # fmt: skip
ENGINE = {"engine": "vllm", "model": "m"}
INPUT = {"size": 10, "mtime": 5}


def spec(**sampling: Any) -> JobSpec:
    return JobSpec(**SPEC, params={"prompt_template": "Q {{ q }}", "sampling": sampling})  # type: ignore[arg-type]


def test_fingerprints_cover_every_honoured_field_and_old_ones_stay() -> None:
    """A finished job's manifest matches while its fingerprint does: a job asking for none of the new
    fields keeps the fingerprint and job id it had (pinned here, as computed before they existed);
    any honoured field changes both, so a changed request never reuses another's outputs."""
    old = spec(max_tokens=32, temperature=0.7, seed=1)
    assert (
        fingerprint(old, ENGINE, INPUT) == "a5dbc4de98e16c934c7e6b9689c7c8a6a2285f5b7e5b56aa282eea7c87257a28"
    )
    assert spec_key(old) == "0c33d533f6"
    seen = {fingerprint(old, ENGINE, INPUT)}
    values = {"stop_token_ids": [3], "presence_penalty": 0.5, "frequency_penalty": 0.5,
              "repetition_penalty": 1.2, "top_k": 5, "min_p": 0.1, "min_tokens": 2,
              "logit_bias": {"3": 1}, "ignore_eos": True}  # fmt: skip
    for name, value in values.items():
        changed = spec(max_tokens=32, temperature=0.7, seed=1, **{name: value})
        parse_params("infer", changed.params, engine="vllm")  # a job the worker takes
        seen.add(fingerprint(changed, ENGINE, INPUT))
    assert len(seen) == 1 + len(values)
