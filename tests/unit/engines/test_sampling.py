"""One description of a request's fields (``engines.sampling``): every field of an OpenAI chat or
completions body and of the ``sampling`` param has a schema, a help line and the engines that honour
it; ``SamplingParams``, the engines' declarations, the run settings' ``sampling`` schema and help, the
review gate's form and the docs' table derive from it, and what it does not honour is refused."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from airflow_batchinfer.engines import ENGINES, engine_class
from airflow_batchinfer.engines.base import SamplingParams
from airflow_batchinfer.engines.sampling import (
    ENGINE_NAMES,
    FIELDS,
    PARAM_FIELDS,
    REQUEST_FIELDS,
    SAMPLING_FIELDS,
    engine_refusal,
    honoured,
    reference_table,
    refusal,
    refusals,
    sampling_schema,
    sampling_schemas,
)
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.spec.settings import setting
from airflow_batchinfer.state.config_sections import SAMPLING_PROPERTIES

EDGES: dict[str, list[Any]] = {
    "max_tokens": [-1, 0, 1, 2, 100_000],
    "temperature": [-0.5, -1e-9, 0.0, 0.7, 2.0, 2.0001, 7.5],
    "top_p": [-0.1, 0.0, 1e-9, 0.5, 1.0, 1.0001],
    "presence_penalty": [-2.5, -2.0, 0.0, 2.0, 2.1],
    "frequency_penalty": [-2.01, -1.0, 2.0, 3.0],
    "repetition_penalty": [-1.0, 0.0, 1e-9, 1.0, 3.0],
    "top_k": [-2, -1, 0, 1, 40],
    "min_p": [-0.1, 0.0, 0.5, 1.0, 1.1],
    "min_tokens": [-1, 0, 5],
}

# OpenAI's chat completions and completions request bodies (the API reference's fields), and vLLM's
# extensions this release reads: each must be in the description, honoured or refused, never unknown.
OPENAI_CHAT = (
    "messages",
    "model",
    "audio",
    "frequency_penalty",
    "function_call",
    "functions",
    "logit_bias",
    "logprobs",
    "max_completion_tokens",
    "max_tokens",
    "metadata",
    "modalities",
    "n",
    "parallel_tool_calls",
    "prediction",
    "presence_penalty",
    "prompt_cache_key",
    "reasoning_effort",
    "response_format",
    "safety_identifier",
    "seed",
    "service_tier",
    "stop",
    "store",
    "stream",
    "stream_options",
    "temperature",
    "tool_choice",
    "tools",
    "top_logprobs",
    "top_p",
    "user",
    "verbosity",
    "web_search_options",
)
OPENAI_COMPLETIONS = (
    "model",
    "prompt",
    "best_of",
    "echo",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "max_tokens",
    "n",
    "presence_penalty",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "suffix",
    "temperature",
    "top_p",
    "user",
)
VLLM_EXTRA = (
    "top_k",
    "min_p",
    "repetition_penalty",
    "min_tokens",
    "stop_token_ids",
    "ignore_eos",
    "structured_outputs",
)


def schema_takes(name: str, value: Any, properties: dict[str, Any] = SAMPLING_FIELDS) -> bool:
    try:
        jsonschema.validate({name: value}, {"type": "object", "properties": properties})
    except jsonschema.ValidationError:
        return False
    return True


def engine_refusal_of(name: str, value: Any) -> str | None:
    try:
        SamplingParams.from_mapping({name: value})
    except ConfigError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("name", sorted(EDGES))
def test_the_engines_bounds_are_the_schemas(name: str) -> None:
    for value in EDGES[name]:
        refused = engine_refusal_of(name, value)
        assert (refused is None) == schema_takes(name, value), (name, value)
        assert refused is None or (name in refused and str(value) in refused)  # names field and value
        assert (refused is None) == (refusal(name, value) is None), (name, value)  # a body: the same


def test_every_field_has_a_schema_a_help_line_and_its_engines() -> None:
    assert ENGINE_NAMES == ENGINES
    assert len(FIELDS) == len(REQUEST_FIELDS)  # one entry per name
    for f in REQUEST_FIELDS:
        jsonschema.Draft202012Validator.check_schema(f.schema)
        assert f.help.strip() and set(f.engines) <= set(ENGINE_NAMES), f.name
        if f.noop:  # taken everywhere, with no effect: said so in the docs' table
            assert f.engines == ENGINE_NAMES, f.name
        for neutral in f.neutral:
            assert schema_takes(f.name, neutral, {f.name: f.schema}) and f.takes(neutral), f.name
    missing = {*OPENAI_CHAT, *OPENAI_COMPLETIONS, *VLLM_EXTRA} - set(FIELDS)
    assert not missing, f"fields of an OpenAI body neither honoured nor refused by name: {missing}"


def test_sampling_params_carries_the_honoured_fields_and_engines_declare_theirs() -> None:
    assert tuple(SamplingParams.__dataclass_fields__) == PARAM_FIELDS
    for name in ENGINES:
        assert engine_class(name).honours() == honoured(name), name
    assert set(PARAM_FIELDS) <= engine_class("vllm").honours()  # vLLM takes every sampling field
    assert {"presence_penalty", "frequency_penalty"}.isdisjoint(engine_class("transformers").honours())
    assert {"repetition_penalty", "top_k", "min_p", "min_tokens", "logit_bias"} <= honoured("transformers")
    assert all("n" in honoured(e) for e in ENGINES)  # candidates: every engine
    assert "best_of" not in honoured("vllm")  # n candidates, each judged, do it (a later release)
    assert {"logprobs", "top_logprobs"} <= honoured("transformers") and "logprobs" not in honoured(
        "simulated"
    )


def test_the_run_settings_sampling_schema_is_the_table() -> None:
    assert sampling_schemas() == SAMPLING_PROPERTIES
    assert setting("sampling").schema()["properties"] == SAMPLING_PROPERTIES
    assert setting("sampling").schema()["additionalProperties"] is False  # unknown: refused, not dropped
    assert set(SAMPLING_PROPERTIES) == {f.name for f in REQUEST_FIELDS if not f.body_only}
    assert schema_takes("max_completion_tokens", 1) and not schema_takes("max_completion_tokens", 0)
    # what no engine honours, the trigger form takes only at its neutral values
    assert schema_takes("best_of", 1, SAMPLING_PROPERTIES) and not schema_takes(
        "best_of", 2, SAMPLING_PROPERTIES
    )
    assert schema_takes("n", 4, SAMPLING_PROPERTIES) and not schema_takes("n", 0, SAMPLING_PROPERTIES)
    assert schema_takes("stream", False, SAMPLING_PROPERTIES)
    assert not schema_takes("stream", True, SAMPLING_PROPERTIES)
    assert schema_takes("presence_penalty", 1.5, SAMPLING_PROPERTIES)


def test_the_help_and_the_docs_table_derive_from_the_description() -> None:
    help_text = setting("sampling").help
    assert all(name in help_text for name in PARAM_FIELDS)
    header, rows = reference_table()
    assert [r[0] for r in rows] == [f"``{f.name}``" for f in REQUEST_FIELDS] and len(header) == len(rows[0])
    cells = {r[0].strip("`"): r for r in rows}
    assert cells["presence_penalty"][3] == "``vllm``, ``openai``, ``simulated``; the others only ``0``"
    assert cells["best_of"][3] == "none: only ``null``, ``1``" and cells["user"][3] == "all (no effect)"
    assert cells["n"][3] == "all" and cells["logprobs"][3].startswith(
        "``vllm``, ``transformers``, ``openai``"
    )
    assert cells["temperature"][1] == "number in [0, 2]" and cells["top_p"][1] == "number in (0, 1]"


def test_a_review_gate_takes_the_sampling_params_bounds() -> None:
    from airflow_batchinfer.run.gate.changes import GATE_SCHEMAS

    for name in ("temperature", "max_tokens"):
        assert GATE_SCHEMAS[name] == sampling_schema(name), name


@pytest.mark.parametrize(
    ("values", "engine", "named"),
    [
        ({"presence_penalty": 0.5}, "transformers", ["presence_penalty=0.5", "transformers engine"]),
        ({"best_of": 2}, "vllm", ["best_of=2", "only 1", "set it to 1"]),
        ({"n": True}, "vllm", ["n=true", "not of type"]),  # a boolean is not the integer 1
        ({"logprobs": True}, "simulated", ["logprobs=true", "simulated engine"]),
        ({"n": 0}, "vllm", ["n must be in [1, 128], got 0"]),
        (
            {"response_format": {"type": "json_object"}},
            "transformers",
            ["response_format", "transformers engine", "(vllm, openai)"],
        ),
        ({"stream": True}, "simulated", ["stream=true", "set it to false"]),
        ({"tools": [{"type": "function"}]}, "vllm", ["tools="]),
        ({"temperature": 3}, "vllm", ["temperature must be in [0, 2], got 3"]),
        ({"logit_bias": {"a": 1}}, "vllm", ["logit_bias", "'a'"]),
        ({"stop": ""}, "vllm", ["stop"]),
        ({"best_of_n": 3}, "vllm", ["best_of_n", "not a field", "remove it"]),
    ],
)
def test_a_field_not_honoured_is_refused_naming_it(
    values: dict[str, Any], engine: str | None, named: list[str]
) -> None:
    (why,) = refusals(values, engine)
    assert all(part in why for part in named), why
    assert why.startswith("body field ")


def test_neutral_no_op_and_null_values_are_taken_everywhere() -> None:
    body = {
        "model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "n": 1, "stream": False,
        "logprobs": False, "tools": [], "tool_choice": "none", "response_format": {"type": "text"},
        "user": "u-1", "metadata": {"k": "v"}, "store": True, "temperature": None, "seed": None,
    }  # fmt: skip
    for engine in (None, *ENGINES):
        assert refusals(body, engine) == [], engine
    assert refusals({"presence_penalty": 0.5}, "vllm") == []
    assert refusals({"presence_penalty": 0, "frequency_penalty": 0.0}, "transformers") == []  # defaults
    assert refusals({"presence_penalty": 0.5}) == []  # some engine honours it: no engine named, taken


def test_the_sampling_param_refuses_a_request_s_own_fields() -> None:
    (why,) = refusals({"messages": []}, in_body=False)
    assert why.startswith("sampling.messages is part of a request")
    (why,) = refusals({"presence_penalty": 0.5}, "transformers", in_body=False)
    assert why.startswith("sampling.presence_penalty=0.5 is refused: the transformers engine")


def test_engine_refusal_names_the_field_and_the_engines_that_honour_it() -> None:
    sampling = SamplingParams.from_mapping({"frequency_penalty": 0.2, "top_k": 4})
    why = engine_refusal(sampling.changed(), "transformers")
    assert why is not None and "frequency_penalty" in why and "(vllm, openai, simulated)" in why
    assert engine_refusal(sampling.changed(), "vllm") is None
    assert engine_class("transformers")("m").sampling_refusal(sampling) == why


def test_from_mapping_reads_every_honoured_field() -> None:
    s = SamplingParams.from_mapping({
        "max_completion_tokens": 9, "max_tokens": 99, "stop": "END", "stop_token_ids": [5, 6],
        "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.3, "top_k": -1,
        "min_p": 0.05, "min_tokens": 2, "logit_bias": {"7": 5, "3": -100}, "ignore_eos": True,
    })  # fmt: skip
    assert (s.max_tokens, s.stop, s.stop_token_ids) == (9, ("END",), (5, 6))
    assert (s.presence_penalty, s.frequency_penalty, s.repetition_penalty) == (0.5, -0.5, 1.3)
    assert (s.top_k, s.min_p, s.min_tokens, s.ignore_eos) == (0, 0.05, 2, True)  # top_k -1: 0, every token
    assert s.logit_bias == ((3, -100.0), (7, 5.0))
    hash(s)  # the transformers engine groups requests by their sampling
    with pytest.raises(ConfigError, match="min_tokens 12 is above max_tokens 9"):
        SamplingParams.from_mapping({"min_tokens": 12}, s)


def test_as_dict_of_the_five_old_fields_is_what_it_was() -> None:
    """A job's manifest and an llm judge's description record ``as_dict()``: without the new fields it
    is what it was before they existed, so what was recorded then still matches."""
    old = SamplingParams.from_mapping({"max_tokens": 32, "temperature": 0.7, "seed": 1})
    assert old.as_dict() == {"max_tokens": 32, "temperature": 0.7, "top_p": 1.0, "seed": 1, "stop": []}
    new = SamplingParams.from_mapping({"max_tokens": 32, "repetition_penalty": 1.2, "logit_bias": {"4": 1}})
    assert new.as_dict()["repetition_penalty"] == 1.2 and new.as_dict()["logit_bias"] == {"4": 1.0}
    assert new.changed() == {"max_tokens": 32, "repetition_penalty": 1.2, "logit_bias": {"4": 1.0}}
