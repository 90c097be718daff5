"""Structured outputs (``engines.structured``): one canonical constraint read from
``structured_outputs`` or ``response_format``, checked up front so a bad one is that record's error
row naming the field, carried by ``SamplingParams`` into ``changed()``/``as_dict()`` (so the job
fingerprint), mapped by vLLM and the openai engine, refused per record by transformers and the
simulated engine; the llm judge asks for its verdict as a schema where the engine honours it."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import httpx
import pytest

from airflow_batchinfer.engines import GenerationRequest, GenerationResult, SamplingParams, create_engine
from airflow_batchinfer.engines.openai import OpenAIEngine
from airflow_batchinfer.engines.sampling import honoured, refusals
from airflow_batchinfer.engines.structured import StructuredOutput
from airflow_batchinfer.engines.vllm import sampling_args
from airflow_batchinfer.exceptions import ConfigError, PromptError
from airflow_batchinfer.judges import JudgeItem, build_judge
from airflow_batchinfer.judges.llm import VERDICT_SCHEMA, LLMJudge, schema_verdicts
from airflow_batchinfer.prompts.build import PromptBuilder
from airflow_batchinfer.rpc.fingerprint import NON_SEMANTIC, fingerprint
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.state.params import parse_params

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
SAME_SCHEMA_REORDERED = {"required": ["city"], "properties": {"city": {"type": "string"}}, "type": "object"}
CHAT = [{"role": "user", "content": "hi"}]


def constraint(values: dict[str, Any]) -> StructuredOutput | None:
    return SamplingParams.from_mapping(values).structured_outputs


def body(**fields: Any) -> dict[str, Any]:
    return {"custom_id": "r-1", "body": {"messages": CHAT, **fields}}


def json_schema(schema: Any, **extra: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "city", "schema": schema, **extra}}


def test_each_kind_reads_into_one_canonical_constraint() -> None:
    a = constraint({"structured_outputs": {"json": SCHEMA}})
    assert a == constraint({"structured_outputs": {"json": SAME_SCHEMA_REORDERED}})
    assert a == constraint({"structured_outputs": {"json": json.dumps(SCHEMA)}})  # JSON text of it too
    assert a == constraint({"response_format": json_schema(SAME_SCHEMA_REORDERED, strict=True)})
    assert (
        a is not None
        and (a.kind, a.value) == ("json", SCHEMA)
        and hash(a) == hash(constraint({"response_format": json_schema(SCHEMA)}))
    )
    # the order of properties is the order answers write them in: a different constraint
    swapped = {**SCHEMA, "properties": {"b": {"type": "string"}, "city": {"type": "string"}}}
    plain = {**SCHEMA, "properties": {"city": {"type": "string"}, "b": {"type": "string"}}}
    assert constraint({"structured_outputs": {"json": swapped}}) != constraint(
        {"structured_outputs": {"json": plain}}
    )
    assert list(constraint({"structured_outputs": {"json": swapped}}).value["properties"]) == ["b", "city"]  # type: ignore[union-attr]
    nested = {
        "type": "object",
        "properties": {"properties": {"type": "object", "properties": {"z": {}, "a": {}}}},
    }
    assert list(
        constraint({"structured_outputs": {"json": nested}}).value["properties"]["properties"]["properties"]
    ) == [  # type: ignore[union-attr]
        "z",
        "a",
    ]
    assert constraint({"response_format": {"type": "json_object"}}) == constraint(
        {"structured_outputs": {"json_object": True}}
    )
    assert constraint({"structured_outputs": {"regex": "[0-9]+"}}) == StructuredOutput("regex", '"[0-9]+"')
    assert constraint({"structured_outputs": {"choice": ["yes", "no"]}}) == StructuredOutput(
        "choice", '["yes","no"]'
    )
    assert constraint({"structured_outputs": {"choice": ["no", "yes"]}}) != constraint(
        {"structured_outputs": {"choice": ["yes", "no"]}}
    )  # the order of choices is kept: it is what was asked
    assert constraint({"structured_outputs": {"grammar": 'root ::= "a"'}}).kind == "grammar"  # type: ignore[union-attr]
    assert constraint({"response_format": {"type": "text"}}) is None  # text: no constraint
    base = SamplingParams.from_mapping({"structured_outputs": {"regex": "a"}})
    assert SamplingParams.from_mapping({"response_format": {"type": "text"}}, base) == base  # neutral


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("structured_outputs", {"json": {"type": "nonsense"}}, "json is not a valid JSON Schema"),
        ("structured_outputs", {"json": {"minLength": -1}}, "not a valid JSON Schema"),
        ("structured_outputs", {"json": "{not json"}, "not JSON text"),
        ("structured_outputs", {"json": "[1]"}, "must be a JSON Schema object"),
        ("structured_outputs", {"regex": "(unclosed"}, "regex does not compile"),
        ("structured_outputs", {"choice": []}, "should be non-empty"),
        ("structured_outputs", {"choice": ["a", 1]}, "is not of type 'string'"),
        ("structured_outputs", {"grammar": ""}, "should be non-empty"),
        ("structured_outputs", {"json_object": False}, "True was expected"),
        ("structured_outputs", {"regex": "a", "choice": ["a"]}, "has too many properties"),
        ("structured_outputs", {}, "should be non-empty"),
        ("structured_outputs", {"guided_json": {}}, "Additional properties"),
        ("response_format", {"type": "json_schema"}, "'json_schema' is a required property"),
        ("response_format", {"type": "json_schema", "json_schema": {"schema": SCHEMA}}, "'name'"),
        ("response_format", json_schema({"type": 3}), "json_schema.schema is not a valid JSON Schema"),
        ("response_format", {"type": "structural_tag"}, "is not one of"),
        (
            "response_format",
            {"type": "text", "json_schema": {"name": "x", "schema": {}}},
            "should not be valid",
        ),
    ],
)
def test_a_bad_constraint_is_that_records_error_naming_the_field(field: str, value: Any, named: str) -> None:
    (why,) = refusals({field: value}, "vllm")
    assert why.startswith(f"body field {field}=") and "is refused" in why and named in why, why
    with pytest.raises(PromptError, match=f"record 'r-1': body field {field}"):
        PromptBuilder(None, engine="vllm").build(body(**{field: value}), request_id="r-1")
    (why,) = refusals({field: value}, in_body=False)  # the job's sampling: refused at submit
    assert why.startswith(f"sampling.{field}=")
    with pytest.raises(ConfigError, match=f"sampling.{field}"):
        parse_params("infer", {"prompt_template": "{{ q }}", "sampling": {field: value}}, engine="vllm")


def test_both_fields_must_agree_else_the_record_is_refused_naming_both() -> None:
    builder = PromptBuilder(None, engine="vllm")
    same = builder.build(
        body(structured_outputs={"json": SCHEMA}, response_format=json_schema(SAME_SCHEMA_REORDERED)),
        request_id="r-1",
    )
    assert same.sampling.structured_outputs == constraint({"structured_outputs": {"json": SCHEMA}})
    for other in (json_schema({"type": "object"}), {"type": "json_object"}, {"type": "text"}):
        with pytest.raises(PromptError) as refused:
            builder.build(body(structured_outputs={"json": SCHEMA}, response_format=other), request_id="r-1")
        assert "record 'r-1'" in str(refused.value)
        assert "structured_outputs" in str(refused.value) and "response_format" in str(refused.value)
    with pytest.raises(ConfigError, match=r"structured_outputs .* and response_format"):
        parse_params(
            "infer",
            {
                "prompt_template": "q",
                "sampling": {
                    "structured_outputs": {"regex": "a"},
                    "response_format": {"type": "json_object"},
                },
            },
        )


def test_engines_honour_it_or_refuse_it_per_record_naming_the_engines_that_do() -> None:
    assert {
        e for e in ("vllm", "transformers", "openai", "simulated") if "structured_outputs" in honoured(e)
    } == {"vllm", "openai"}
    assert "response_format" in honoured("openai") and "response_format" not in honoured("transformers")
    for engine in ("transformers", "simulated"):
        for field, value in (
            ("structured_outputs", {"choice": ["a"]}),
            ("response_format", {"type": "json_object"}),
        ):
            with pytest.raises(PromptError) as refused:
                PromptBuilder(None, engine=engine).build(body(**{field: value}), request_id="r-1")
            why = str(refused.value)
            assert f"body field {field}" in why and f"the {engine} engine does not honour it" in why
            assert "(vllm, openai)" in why
        # the job's own sampling: each templated record's error, naming the field
        builder = PromptBuilder(
            "{{ q }}",
            sampling=SamplingParams.from_mapping({"structured_outputs": {"regex": "a+"}}),
            engine=engine,
        )
        with pytest.raises(PromptError, match=r"the job's sampling\.structured_outputs is refused"):
            builder.build({"q": "x"}, request_id="1")
    # an engine handed one directly (no prompt builder in between) answers that request's error
    sim = create_engine("simulated", latency_base_s=0.0)
    asked = SamplingParams.from_mapping({"structured_outputs": {"choice": ["a"]}})
    out = sim._one(GenerationRequest("1", prompt="p", sampling=asked))
    assert not out.ok and "structured_outputs" in (out.error or "")
    tf = create_engine("transformers", model="unused")
    assert "structured_outputs" in (tf.sampling_refusal(asked) or "")


def test_it_is_in_changed_as_dict_and_the_fingerprint() -> None:
    s = SamplingParams.from_mapping({"max_tokens": 8, "response_format": json_schema(SCHEMA)})
    assert s.changed() == {"max_tokens": 8, "structured_outputs": {"json": SCHEMA}}
    assert s.as_dict()["structured_outputs"] == {"json": SCHEMA}
    assert "structured_outputs" not in SamplingParams(max_tokens=8).as_dict()  # old descriptions stay
    spec = {"job_id": "j", "kind": "infer", "input": "/i", "outputs": {"inferred": "/o", "manifest": "/m"}}
    seen = set()
    for sampling in (
        {},
        {"structured_outputs": {"regex": "a"}},
        {"structured_outputs": {"regex": "b"}},
        {"structured_outputs": {"choice": ["a"]}},
        {"response_format": {"type": "json_object"}},
    ):
        job = JobSpec(**spec, params={"prompt_template": "q", "sampling": sampling})  # type: ignore[arg-type]
        parse_params("infer", job.params, engine="vllm")  # a job the worker takes
        seen.add(fingerprint(job, {"engine": "vllm"}, {"size": 1}))
    assert len(seen) == 5


def test_vllm_gets_its_structured_outputs_params_arguments() -> None:
    args = sampling_args(SamplingParams.from_mapping({"response_format": json_schema(SCHEMA)}))
    assert args["structured_outputs"] == {"json": SCHEMA}
    args = sampling_args(SamplingParams.from_mapping({"structured_outputs": {"choice": ["x", "y"]}}))
    assert args["structured_outputs"] == {"choice": ["x", "y"]}
    assert sampling_args(SamplingParams())["structured_outputs"] is None


async def test_the_openai_engine_passes_response_format_or_structured_outputs_on() -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        msg = {"role": "assistant", "content": "{}"}
        return httpx.Response(200, json={"choices": [{"message": msg, "finish_reason": "stop"}], "usage": {}})

    engine = OpenAIEngine(
        "m", base_url="http://llm.local/v1", api_key="k", transport=httpx.MockTransport(handler)
    )
    await engine.start()
    for values in (
        {"response_format": json_schema(SCHEMA)},
        {"structured_outputs": {"json_object": True}},
        {"structured_outputs": {"regex": "[0-9]+"}},
        {"structured_outputs": {"choice": ["yes", "no"]}},
    ):
        request = GenerationRequest("1", messages=CHAT, sampling=SamplingParams.from_mapping(values))
        (out,) = await engine.generate([request])
        assert out.ok
    await engine.close()
    schema, obj, regex, choice = bodies
    assert (
        schema["response_format"]
        == {"type": "json_schema", "json_schema": {"name": "response", "schema": SCHEMA, "strict": True}}
        and "structured_outputs" not in schema
    )
    assert obj["response_format"] == {"type": "json_object"} and "structured_outputs" not in obj
    assert regex["structured_outputs"] == {"regex": "[0-9]+"} and "response_format" not in regex
    assert choice["structured_outputs"] == {"choice": ["yes", "no"]}


VERDICT = SamplingParams.from_mapping({"structured_outputs": {"json": VERDICT_SCHEMA}}).structured_outputs


@pytest.mark.parametrize(
    ("engine", "asks"),
    [("vllm", True), ("openai", True), ("transformers", False), ("simulated", False), (None, False)],
)
async def test_the_llm_judge_asks_for_a_verdict_schema_where_the_engine_honours_it(
    engine: str | None, asks: bool
) -> None:
    params = parse_params("judge", {"judge": {"type": "llm"}}, engine=engine)
    judge = params.judge
    assert isinstance(judge, LLMJudge)
    assert (judge.sampling.structured_outputs == VERDICT) is asks
    assert judge.describe().get("verdict_schema", False) is asks
    assert ("structured_outputs" in judge.describe()["sampling"]) is asks
    sent: list[GenerationRequest] = []

    async def generate(requests: list[GenerationRequest]) -> list[GenerationResult]:
        sent.extend(requests)
        return [GenerationResult('{"approved": true, "reason": "fine", "score": 0.9}') for _ in requests]

    (verdict,) = await judge.judge([JudgeItem({"q": "x"}, "answer", "1")], generate)
    assert verdict.approved and verdict.score == 0.9  # parsed the same way either way
    assert (sent[0].sampling.structured_outputs == VERDICT) is asks
    # nested judges get the engine too
    combined = build_judge({"type": "all", "judges": [{"type": "llm"}]}, callables=None, engine=engine)
    assert combined.describe()["judges"][0].get("verdict_schema", False) is asks  # type: ignore[attr-defined]


def test_a_judge_asking_for_its_own_constraint_keeps_it() -> None:
    own = {"type": "llm", "sampling": {"structured_outputs": {"choice": ["APPROVED", "REJECTED"]}}}
    judge = build_judge(own, callables=None, engine="vllm")
    assert isinstance(judge, LLMJudge) and not judge.verdict_schema
    assert judge.sampling.structured_outputs == StructuredOutput("choice", '["APPROVED","REJECTED"]')
    assert not schema_verdicts(own, "vllm") and schema_verdicts({"type": "llm"}, "vllm")
    assert not schema_verdicts({"type": "regex", "pattern": "x"}, "vllm")


def _old_fingerprint(spec: JobSpec, engine: dict[str, Any], info: dict[str, Any]) -> str:
    """The fingerprint as it was computed before verdict schemas existed."""
    payload = {
        "kind": spec.kind,
        "engine": engine,
        "params": {k: v for k, v in spec.params.items() if k not in NON_SEMANTIC},
        "input": {"uri": spec.input, "size": info.get("size"), "version": str(info.get("mtime") or "")},
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def test_a_judge_jobs_fingerprint_changes_only_where_the_verdict_schema_is_asked_for() -> None:
    outputs = {"approved": "/a", "rejected": "/r", "manifest": "/m"}
    llm = JobSpec(job_id="j", kind="judge", input="/i", outputs=outputs, params={"judge": {"type": "llm"}})
    rules = JobSpec(
        job_id="j",
        kind="judge",
        input="/i",
        outputs=outputs,
        params={"judge": {"type": "length", "min_chars": 1}},
    )
    info = {"size": 3, "mtime": 4}
    for engine in ({"engine": "transformers"}, {"engine": "simulated"}):
        assert fingerprint(llm, engine, info) == _old_fingerprint(llm, engine, info)
    for engine in ({"engine": "vllm"}, {"engine": "openai"}):
        assert fingerprint(llm, engine, info) != _old_fingerprint(llm, engine, info)
        assert fingerprint(rules, engine, info) == _old_fingerprint(rules, engine, info)


def test_verdict_schema_false_asks_in_free_text_and_keeps_the_old_fingerprint() -> None:
    off = {"type": "llm", "verdict_schema": False}
    judge = build_judge(off, callables=None, engine="vllm")
    assert isinstance(judge, LLMJudge) and not judge.verdict_schema
    assert judge.sampling.structured_outputs is None and not schema_verdicts(off, "vllm")
    with pytest.raises(ConfigError, match="verdict_schema must be true or false"):
        build_judge({"type": "llm", "verdict_schema": "yes"}, callables=None, engine="vllm")
    outputs = {"approved": "/a", "rejected": "/r", "manifest": "/m"}
    spec = JobSpec(job_id="j", kind="judge", input="/i", outputs=outputs, params={"judge": off})
    assert fingerprint(spec, {"engine": "vllm"}, {"size": 1}) == _old_fingerprint(
        spec, {"engine": "vllm"}, {"size": 1}
    )


def test_records_whose_schemas_differ_only_in_property_order_get_their_own_constraint() -> None:
    builder = PromptBuilder(None, engine="vllm")  # it remembers decisions per distinct set of fields
    first = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}}
    second = {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "string"}}}
    one = builder.build(body(structured_outputs={"json": first}), request_id="r-1")
    two = builder.build(body(structured_outputs={"json": second}), request_id="r-2")
    assert list(one.sampling.structured_outputs.value["properties"]) == ["a", "b"]  # type: ignore[union-attr]
    assert list(two.sampling.structured_outputs.value["properties"]) == ["b", "a"]  # type: ignore[union-attr]
