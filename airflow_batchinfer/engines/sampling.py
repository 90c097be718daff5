"""The fields of a request: one description (:data:`REQUEST_FIELDS`) of every field of an OpenAI chat
or completions body and of the ``sampling`` param, with its JSON schema, a line of help and the
engines that honour it.

A field is *honoured* by the engines it names (the engines read it: ``SamplingParams`` carries it and
each engine maps it), *accepted as a no-op* when it changes no output (``user``, ``metadata``: listed
so), or *refused*: a value other than ``null`` or its neutral values (``n: 1``, ``stream: false``) on
an engine that does not honour it, a value outside its schema, or a field this description does not
know. Nothing is dropped silently: a record whose body asks for a refused field is that record's
error row, naming the field (:func:`refusals`); the run's ``sampling`` param is refused when the run
starts (no engine honours it) and when its pool's engine is known (that engine does not).

From this one description derive: :class:`~airflow_batchinfer.engines.base.SamplingParams` (its
fields are :data:`PARAM_FIELDS`, its bounds these schemas'), each engine's honoured fields
(``Engine.honours``), the run settings' ``sampling`` schema (``settings.SAMPLING_PROPERTIES``: the
``sampling`` fields, :data:`SAMPLING_FIELDS`) and its help, the review gate's form
(``run/gate/changes.py``) and the docs' table (:func:`reference_table`).

This module imports nothing at import time (the run settings and the worker side both import it).
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_batchinfer.engines import structured
from airflow_batchinfer.engines.reasoning import EFFORTS
from airflow_batchinfer.engines.structured import RESPONSE_FORMAT_SCHEMA, STRUCTURED_OUTPUTS_SCHEMA
from airflow_batchinfer.engines.tools import TOOL_CHOICE_SCHEMA, TOOLS_SCHEMA
from airflow_batchinfer.fields import Described

#: The engines (``engines.ENGINES``, which a test holds equal): named here, where nothing is imported.
ENGINE_NAMES = ("vllm", "transformers", "openai", "simulated")
_NOT_TRANSFORMERS = ("vllm", "openai", "simulated")  # OpenAI's additive penalties: not in generate()
# structured outputs: vLLM's backends (xgrammar, guidance, outlines), and the openai engine passes them
# on; transformers has no constrained decoding in its environment, the simulated engine writes no text
# a constraint could hold
_STRUCTURED = ("vllm", "openai")
# token log probabilities: the simulated engine's answers come from no model that has any
_LOGPROBS = ("vllm", "transformers", "openai")
# chat template variables: the engines that render one (vllm, transformers) or pass them on (openai);
# the simulated engine has no template
_TEMPLATES = ("vllm", "transformers", "openai")
# a thinking budget: vLLM's, and a logits processor of the same rule on transformers (both need the
# pool's reasoning_parser); the openai engine passes it on
_THINKING_BUDGET = ("vllm", "transformers", "openai")
# tool calls: vLLM renders the tools with the chat template and parses the answer with the tool parser
# its pool pins (engine option tool_parser); the openai engine passes them on. transformers has no
# tool parser, the simulated engine's answers make no calls
_TOOLS = ("vllm", "openai")
MAX_N = 128  # candidates per record
MAX_TOP_LOGPROBS = 20  # OpenAI's bound (vLLM's default max_logprobs too)


@dataclass(frozen=True, kw_only=True)
class RequestField(Described):
    """One field of a request body or of the ``sampling`` param
    (:class:`~airflow_batchinfer.fields.Described`: its type and bounds are its ``schema``'s).

    :param schema: its JSON schema.
    :param engines: the engines that honour a value of it (``()``: none in this release, so only
        ``null`` and the ``neutral`` values are taken).
    :param neutral: values that ask for nothing (``n: 1``): taken on every engine.
    :param body_only: the request itself (``model``, ``messages``, ``prompt``): a record's body has it,
        the ``sampling`` param may not.
    :param noop: taken on every engine and changes no output (the docs list it as such).
    """

    schema: dict[str, Any]
    engines: tuple[str, ...] = ENGINE_NAMES
    neutral: tuple[Any, ...] = ()
    body_only: bool = False
    noop: bool = False

    def honoured_by(self, engine: str) -> bool:
        return engine in self.engines

    def takes(self, value: Any) -> bool:
        """Whether ``value`` asks for nothing (``null`` or a neutral value): taken on every engine."""
        return value is None or any(_same(value, n) for n in self.neutral)


def _same(value: Any, neutral: Any) -> bool:
    """JSON equality: ``0`` is ``0.0``, ``true`` is not ``1``."""
    numbers = (int, float)
    if isinstance(value, bool) or isinstance(neutral, bool) or not isinstance(value, numbers):
        return type(value) is type(neutral) and value == neutral
    return isinstance(neutral, numbers) and value == neutral


def _f(name: str, schema: dict[str, Any], help: str, **kw: Any) -> RequestField:
    return RequestField(name=name, schema=schema, help=help, **kw)


def _nullable(kind: str | list[str], **bounds: Any) -> dict[str, Any]:
    kinds = [kind] if isinstance(kind, str) else kind
    return {"type": [*kinds, "null"], **bounds}


_OBJECT = _nullable("object")
_ARRAY = _nullable("array")
_LATER = "not in this release"

#: Every field a request body or the ``sampling`` param may carry, in the docs' order.
REQUEST_FIELDS: tuple[RequestField, ...] = (
    # the request itself
    _f("messages", {"type": "array", "items": {"type": "object"}},
       "the chat prompt, through the model's chat template", body_only=True),
    _f("prompt", {"type": "string"}, "the raw prompt (a completions body)", body_only=True),
    _f("model", {"type": "string"}, "not a choice: the pool's model answers (output_format openai rows "
       "echo it)", body_only=True, noop=True),
    # honoured sampling
    _f("max_tokens", _nullable("integer", minimum=1), "the most tokens an answer may have (default 256)"),
    _f("max_completion_tokens", _nullable("integer", minimum=1),
       "OpenAI's newer name for max_tokens (wins over it)"),
    _f("temperature", _nullable("number", minimum=0, maximum=2), "0: greedy (the default)"),
    _f("top_p", _nullable("number", exclusiveMinimum=0, maximum=1), "nucleus sampling (default 1: off)"),
    _f("seed", _nullable("integer"), "a sampled answer's seed; each retry derives its own from it"),
    _f("stop", {"type": ["string", "array", "null"], "minLength": 1,
                "items": {"type": "string", "minLength": 1}},
       "the answer ends before the first of these strings"),
    _f("stop_token_ids", _nullable("array", items={"type": "integer", "minimum": 0}),
       "the answer ends at the first of these token ids"),
    _f("presence_penalty", _nullable("number", minimum=-2, maximum=2),
       "OpenAI's penalty on tokens already in the answer (default 0)", engines=_NOT_TRANSFORMERS,
       neutral=(0,)),
    _f("frequency_penalty", _nullable("number", minimum=-2, maximum=2),
       "OpenAI's penalty per repeat of a token in the answer (default 0)", engines=_NOT_TRANSFORMERS,
       neutral=(0,)),
    _f("repetition_penalty", _nullable("number", exclusiveMinimum=0),
       "divides the scores of tokens already seen, prompt included (default 1: off)"),
    _f("top_k", _nullable("integer", minimum=-1), "sample among the k likeliest tokens (0 or -1: all)"),
    _f("min_p", _nullable("number", minimum=0, maximum=1),
       "drop tokens less likely than this share of the likeliest one (default 0: off)"),
    _f("min_tokens", _nullable("integer", minimum=0), "no end of the answer before this many tokens"),
    _f("logit_bias", _nullable("object", propertyNames={"pattern": "^[0-9]+$"},
                               additionalProperties={"type": "number", "minimum": -100, "maximum": 100}),
       "token id -> bias added to its score, -100 to 100"),
    _f("ignore_eos", _nullable("boolean"), "generate on past the end-of-sequence token, to max_tokens"),
    # structured outputs: one constraint (engines.structured), read from either field
    _f("structured_outputs", STRUCTURED_OUTPUTS_SCHEMA,
       "vLLM's structured output, exactly one of: json (a JSON Schema), regex, choice (a list of strings), "
       "grammar (EBNF) or json_object: true", engines=_STRUCTURED),
    _f("response_format", RESPONSE_FORMAT_SCHEMA,
       "OpenAI's structured output: json_object, or json_schema {name, schema, strict} (read as "
       "structured_outputs json; both given: they must agree)", engines=_STRUCTURED,
       neutral=({"type": "text"},)),
    _f("n", _nullable("integer", minimum=1, maximum=MAX_N),
       "candidates per record (default 1): the judge sees each, the run's select chooses what reaches "
       "results, the report gives pass@k", engines=ENGINE_NAMES, neutral=(1,)),
    _f("logprobs", _nullable(["boolean", "integer"], minimum=0, maximum=MAX_TOP_LOGPROBS),
       "each generated token's log probability (an integer, the completions API's form: with that "
       "many alternatives); rows carry logprobs", engines=_LOGPROBS, neutral=(False,)),
    _f("top_logprobs", _nullable("integer", minimum=0, maximum=MAX_TOP_LOGPROBS),
       "alternatives per token with logprobs (needs logprobs true)", engines=_LOGPROBS, neutral=(0,)),
    # reasoning models (engines.reasoning): through the chat template, and vLLM's thinking budget
    _f("reasoning_effort", {"type": ["string", "null"], "enum": [*EFFORTS, None]},
       "a reasoning model's effort: to the chat template as vLLM's server passes it (reasoning_effort, "
       "and enable_thinking false for none, true otherwise)", engines=_TEMPLATES),
    _f("chat_template_kwargs", _OBJECT,
       "extra variables of the chat template (Qwen3's enable_thinking, say)", engines=_TEMPLATES),
    _f("thinking_token_budget", _nullable("integer", minimum=0),
       "vLLM's thinking budget: the reasoning is ended after this many tokens (a vllm pool needs its "
       "engine option reasoning_parser)", engines=_THINKING_BUDGET),
    # tool calls, parsed into rows and output lines, not executed (engines.tools)
    _f("tools", TOOLS_SCHEMA,
       "function tools the model may call ({type: function, function: {name, description, parameters}}): "
       "its calls are parsed into rows' tool_calls, never executed", engines=_TOOLS, neutral=([],)),
    _f("tool_choice", TOOL_CHOICE_SCHEMA,
       "none, auto (the default with tools), required (at least one call) or {type: function, function: "
       "{name}} (that call)", engines=_TOOLS, neutral=("none", "auto")),
    _f("parallel_tool_calls", _nullable("boolean"),
       "false: at most one call per answer (default true)", engines=_TOOLS, neutral=(True,)),
    # taken, with no effect on the output
    _f("user", _nullable("string"), "the end user's id, for the API's abuse checks", noop=True),
    _f("safety_identifier", _nullable("string"), "the end user's id, for the API's abuse checks", noop=True),
    _f("metadata", _OBJECT, "tags for the API's own records", noop=True),
    _f("store", _nullable("boolean"), "whether the API keeps the answer", noop=True),
    _f("service_tier", _nullable("string"), "the API's latency tier", noop=True),
    _f("prompt_cache_key", _nullable("string"), "the API's prompt-cache hint (vLLM caches prefixes "
       "itself)", noop=True),
    # refused unless neutral: what later releases add
    _f("best_of", _nullable("integer", minimum=1), f"candidates to pick from: only 1, {_LATER} (n "
       "candidates, each judged, and the run's select, do it)", engines=(), neutral=(1,)),
    _f("functions", _ARRAY, "OpenAI's deprecated form of tools: give each function f as "
       "{type: function, function: f} in tools", engines=(), neutral=([],)),
    _f("function_call", _nullable(["string", "object"]), "OpenAI's deprecated form of tool_choice: give "
       "tool_choice (none, auto, or {type: function, function: {name}})", engines=(),
       neutral=("none", "auto")),
    _f("stream", _nullable("boolean"), "batch answers are whole: only false", engines=(), neutral=(False,)),
    _f("stream_options", _OBJECT, "batch answers are whole: not streamed", engines=()),
    _f("echo", _nullable("boolean"), f"the prompt repeated in the answer: {_LATER}", engines=(),
       neutral=(False,)),
    _f("suffix", _nullable("string"), f"text after the completion: {_LATER}", engines=(), neutral=("",)),
    _f("use_beam_search", _nullable("boolean"), f"beam search: {_LATER}", engines=(), neutral=(False,)),
    _f("modalities", _ARRAY, "the output's modalities: text only (images go in as image_url content parts of "
       "messages)", engines=(), neutral=(["text"],)),
    _f("audio", _OBJECT, "audio output: not supported", engines=()),
    _f("prediction", _OBJECT, "predicted outputs: not supported", engines=()),
    _f("verbosity", _nullable("string"), "the answer's verbosity hint: not supported", engines=()),
    _f("web_search_options", _OBJECT, "web search: not supported", engines=()),
)  # fmt: skip

FIELDS: dict[str, RequestField] = {f.name: f for f in REQUEST_FIELDS}

#: The JSON schema of each field the ``sampling`` param takes (nullable: ``null`` means "the
#: default"); SamplingParams checks the same bounds (:func:`bounds_refusal`).
SAMPLING_FIELDS: dict[str, dict[str, Any]] = {f.name: f.schema for f in REQUEST_FIELDS if not f.body_only}

#: The fields read into another one: OpenAI's names of what SamplingParams carries under vLLM's.
READ_AS = {"max_completion_tokens": "max_tokens", "response_format": "structured_outputs"}


def completion_tokens(values: Mapping[str, Any]) -> Any:
    """The completion budget sampling fields ``values`` ask for, as SamplingParams reads it:
    ``max_completion_tokens`` before ``max_tokens`` (``None``: unset; not checked here)."""
    return values.get("max_completion_tokens", values.get("max_tokens"))


#: The fields :class:`~airflow_batchinfer.engines.base.SamplingParams` carries to the engines: every
#: honoured one (``max_completion_tokens`` is read into ``max_tokens``, ``response_format`` into
#: ``structured_outputs``).
PARAM_FIELDS: tuple[str, ...] = tuple(
    f.name for f in REQUEST_FIELDS if f.engines and not (f.noop or f.body_only) and f.name not in READ_AS
)


def honoured(engine: str) -> frozenset[str]:
    """The fields ``engine`` honours (what it declares: ``Engine.honours``)."""
    return frozenset(f.name for f in REQUEST_FIELDS if f.honoured_by(engine))


def sampling_schema(name: str) -> dict[str, Any]:
    """The JSON schema of the sampling field ``name`` (a copy)."""
    return copy.deepcopy(SAMPLING_FIELDS[name])


def sampling_schemas() -> dict[str, dict[str, Any]]:
    """What the ``sampling`` param takes of each field (copies: the ``properties`` of its schema):
    its schema, narrowed to ``null`` and its neutral values where no engine honours it."""
    out = copy.deepcopy(SAMPLING_FIELDS)
    for name, schema in out.items():
        f = FIELDS[name]
        if not (f.engines or f.noop):
            schema["enum"] = [None, *copy.deepcopy(f.neutral)]
    return out


def sampling_help() -> str:
    """The ``sampling`` setting's help (the trigger form's and ``batchinfer run --sampling``'s)."""
    names = ", ".join(PARAM_FIELDS)
    return (
        f"{names} (max_completion_tokens: max_tokens; response_format: structured_outputs), "
        f'e.g. {{"max_tokens": 64, "temperature": 0.7}}; '
        "unset fields: max_tokens 256, temperature 0, top_p 1. A field the run's engine does not honour "
        "is refused when the run starts (the docs' sampling table says which engine honours what)"
    )


def bounds_refusal(name: str, value: float) -> str | None:
    """Why ``value`` is out of the sampling field ``name``'s bounds (``None``: it is within), e.g.
    ``"top_p must be in (0, 1], got 0"``."""
    schema = SAMPLING_FIELDS[name]
    low, low_open = schema.get("minimum"), False
    if "exclusiveMinimum" in schema:
        low, low_open = schema["exclusiveMinimum"], True
    high = schema.get("maximum")
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and value > high
    if not (too_low or too_high):
        return None
    if low is not None and high is not None:
        return f"{name} must be in {'(' if low_open else '['}{low}, {high}], got {value}"
    if low is not None:
        return f"{name} must be {'>' if low_open else '>='} {low}, got {value}"
    return f"{name} must be <= {high}, got {value}"


# ----------------------------------------------------------------------------------------- refusals
def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


@functools.cache
def _validator(name: str) -> Any:
    from jsonschema import validators  # a dependency; loaded on the first check, not on import

    schema = FIELDS[name].schema
    return validators.validator_for(schema)(schema)


def _schema_problem(name: str, value: Any) -> str | None:
    """Why ``value`` is not of field ``name``'s schema (its bounds named as SamplingParams names them)."""
    error = next(iter(_validator(name).iter_errors(value)), None)
    if error is None:
        return None
    if error.validator in ("minimum", "maximum", "exclusiveMinimum") and not error.path:
        return bounds_refusal(name, value)
    return f"{name}: {error.message}"


@functools.lru_cache(maxsize=4096)
def _scalar_refusal(name: str, kind: str, value: Any, engine: str | None, in_body: bool) -> str | None:
    """:func:`_refusal`, remembered: ``kind`` (the value's type) keeps ``1``, ``1.0`` and ``true`` apart."""
    return _refusal(name, value, engine, in_body)


_CONSTRAINTS = ("structured_outputs", "response_format")


def _refusal(name: str, value: Any, engine: str | None, in_body: bool) -> str | None:
    where = f"body field {name}" if in_body else f"sampling.{name}"
    f = FIELDS.get(name)
    if f is None:
        what = "an OpenAI chat or completions body" if in_body else "the sampling param"
        return (
            f"{where} is not a field of {what} that airflow-batchinfer reads, so it is refused rather "
            "than ignored: remove it (the docs' sampling table lists the fields it reads)"
        )
    if f.body_only:  # the prompt: its builder checks it (and the engine renders it), once
        return None if in_body else f"sampling.{name} is part of a request, not a sampling setting: remove it"
    # a constraint is bounded before anything reads it whole (its schema check, an error's text)
    bound = structured.bound_problem(value) if name in _CONSTRAINTS and value is not None else None
    problem = f"{name}: {bound}" if bound else _schema_problem(name, value)
    if problem is None and name in _CONSTRAINTS and value is not None:
        problem = structured.problem(name, value)  # a valid JSON Schema, a regex that compiles
    if problem is not None:
        return f"{where}={_shown(value)} is refused: {problem}: fix or remove it"
    if f.takes(value):
        return None
    neutral = f" or set it to {' or '.join(map(_shown, f.neutral))}" if f.neutral else ""
    if not f.engines:
        return f"{where}={_shown(value)} is refused ({f.help}): remove it{neutral}"
    if engine is not None and not f.honoured_by(engine):
        return f"{where}={_shown(value)} is refused: {_not_honoured(f, engine, neutral)}"
    return None


def _not_honoured(f: RequestField, engine: str, neutral: str = "") -> str:
    return (
        f"the {engine} engine does not honour it: remove it{neutral}, or run it on a pool whose engine "
        f"does ({', '.join(f.engines)})"
    )


def refusal(name: str, value: Any, engine: str | None = None, *, in_body: bool = True) -> str | None:
    """Why field ``name`` = ``value`` of a request body (``in_body``) or of the ``sampling`` param
    cannot run on ``engine`` (``None``: on any engine): a field this description does not know, a
    value outside its schema, or one no engine (or not ``engine``) honours; ``None``: it runs."""
    if value is None or isinstance(value, str | int | float):  # the usual values: checked once each
        return _scalar_refusal(name, type(value).__name__, value, engine, in_body)
    return _refusal(name, value, engine, in_body)


def refusals(values: Mapping[str, Any], engine: str | None = None, *, in_body: bool = True) -> list[str]:
    """:func:`refusal` of every field of ``values`` (``[]``: all of them run)."""
    return [r for name, value in values.items() if (r := refusal(name, value, engine, in_body=in_body))]


def engine_refusal(asked: Iterable[str], engine: str, where: str = "sampling.") -> str | None:
    """Why ``engine`` cannot run a request asking for the fields ``asked`` (SamplingParams fields at
    values other than their defaults): the first it does not honour, named; ``None``: it honours all."""
    for name in asked:
        f = FIELDS[name]
        if not f.honoured_by(engine):
            return f"{where}{name} is refused: {_not_honoured(f, engine)}"
    return None


# ---------------------------------------------------------------------------------------- the docs
def _kind(schema: Mapping[str, Any]) -> str:
    kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    words = []
    for k in kinds:
        if k == "array" and "type" in schema.get("items", {}):
            words.append(f"array of {schema['items']['type']}s")
        elif k != "null":
            words.append(k)
    if "enum" in schema:
        words[-1] += f": {', '.join(str(v) for v in schema['enum'] if v is not None)}"
    low = schema.get("exclusiveMinimum", schema.get("minimum"))
    high = schema.get("maximum")
    opening = "(" if "exclusiveMinimum" in schema else "["
    if low is not None and high is not None:
        words[-1] += f" in {opening}{low}, {high}]"
    elif low is not None:
        words[-1] += f" {'>' if opening == '(' else '>='} {low}"
    return " or ".join(words)


def _engines_cell(f: RequestField) -> str:
    if f.noop:
        return "all (no effect)"
    if not f.engines:
        return "none: only " + ", ".join(f"``{_shown(v)}``" for v in (None, *f.neutral))
    if f.engines == ENGINE_NAMES:
        return "all"
    elsewhere = f"; the others only {', '.join(f'``{_shown(v)}``' for v in f.neutral)}" if f.neutral else ""
    return ", ".join(f"``{e}``" for e in f.engines) + elsewhere


def reference_table() -> tuple[list[str], list[list[str]]]:
    """The header and rows of the docs' table of the fields (cells: text with ````literal```` spans)."""
    header = ["field", "type", "in", "honoured by", "meaning"]
    rows = [
        [f"``{f.name}``", _kind(f.schema), "body" if f.body_only else "body, ``sampling``",
         _engines_cell(f), f.help]
        for f in REQUEST_FIELDS
    ]  # fmt: skip
    return header, rows
