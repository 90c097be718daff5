"""Structured outputs: the one constraint an answer may be held to, read from a request's
``structured_outputs`` (vLLM's: ``json``, ``regex``, ``choice``, ``grammar`` or ``json_object``,
exactly one) or ``response_format`` (OpenAI's: ``text``, ``json_object`` or ``json_schema``).

:class:`StructuredOutput` is canonical and hashable (a kind and a canonical JSON text), so
:class:`~airflow_batchinfer.engines.base.SamplingParams` carries it like any other field and it
enters ``changed()``, ``as_dict()`` and so the job fingerprints. What can be checked before an
engine sees it is checked here (:func:`problem`): a JSON schema is a valid JSON Schema, a regex
compiles (Python's ``re``: a backend's own dialect may still refuse it when the request runs, which
is then that record's error), a choice is a non-empty list of strings, a grammar is non-empty text.
Both fields given and asking for different constraints: refused, naming both.

A constraint is user data (an OpenAI batch body carries its own): before any check it is held to
:data:`MAX_CONSTRAINT_BYTES` and :data:`MAX_CONSTRAINT_DEPTH` (:func:`bound_problem`), which bound
the check's time and recursion; a worker runs the check off its event loop
(:meth:`~airflow_batchinfer.prompts.build.PromptBuilder.abuild`).

This module imports nothing heavy at import time (``jsonschema`` loads on the first check).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: The largest constraint (its JSON text, UTF-8: a schema, a regex, a grammar, the choices) checked:
#: a JSON Schema's check takes time in proportion (about 2 s for 64 KiB of patterns on a busy core).
MAX_CONSTRAINT_BYTES = 64 * 1024
#: The deepest nesting of objects and lists in a constraint checked (a schema nests two per level:
#: ``properties``, then a property): ``jsonschema`` recurses per level, and fails near 200.
MAX_CONSTRAINT_DEPTH = 64

#: The kinds of constraint, as vLLM's ``StructuredOutputsParams`` names them.
KINDS = ("json", "regex", "choice", "grammar", "json_object")

#: ``structured_outputs``' schema: an object of exactly one of :data:`KINDS`.
STRUCTURED_OUTPUTS_SCHEMA: dict[str, Any] = {
    "type": ["object", "null"],
    "properties": {
        "json": {"type": ["object", "string"]},
        "regex": {"type": "string", "minLength": 1},
        "choice": {"type": "array", "minItems": 1, "items": {"type": "string"}},
        "grammar": {"type": "string", "minLength": 1},
        "json_object": {"const": True},
    },
    "additionalProperties": False,
    "minProperties": 1,
    "maxProperties": 1,
}

#: ``response_format``' schema: OpenAI's ``text``, ``json_object`` and ``json_schema``.
RESPONSE_FORMAT_SCHEMA: dict[str, Any] = {
    "type": ["object", "null"],
    "properties": {
        "type": {"enum": ["text", "json_object", "json_schema"]},
        "json_schema": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 64},
                "description": {"type": "string"},
                "schema": {"type": "object"},
                "strict": {"type": ["boolean", "null"]},
            },
            "required": ["name", "schema"],
            "additionalProperties": False,
        },
    },
    "required": ["type"],
    "additionalProperties": False,
    "if": {"properties": {"type": {"const": "json_schema"}}},
    "then": {"required": ["type", "json_schema"]},
    "else": {"not": {"required": ["json_schema"]}},
}


def _canonical(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _schema_order(value: Any, properties: bool = False) -> Any:
    """``value`` (a JSON schema) with the keys of its objects sorted, but the names of a
    ``properties`` map: a backend writes an object's properties in the schema's order, so that order
    is part of the constraint (``{"a", "b"}`` and ``{"b", "a"}`` answer differently), the order of its
    keywords is not."""
    if isinstance(value, dict):
        items = value.items() if properties else sorted(value.items())
        return {k: _schema_order(v, k == "properties" and not properties) for k, v in items}
    if isinstance(value, list):
        return [_schema_order(v) for v in value]
    return value


@dataclass(frozen=True)
class StructuredOutput:
    """One constraint: ``kind`` (one of :data:`KINDS`) and ``spec``, the canonical JSON text of its
    value (a schema, a regex, a list of choices, a grammar, ``true``): equal constraints compare and
    hash equal however they were written (a schema's keywords in any order; the order of its
    properties and of choices is kept: answers follow it)."""

    kind: str
    spec: str

    @property
    def value(self) -> Any:
        """The constraint's value as JSON (a schema object, a regex, a list, a grammar, ``True``)."""
        return json.loads(self.spec)

    def as_json(self) -> dict[str, Any]:
        """As a ``structured_outputs`` object (what ``changed()`` and manifests show)."""
        return {self.kind: self.value}

    def response_format(self) -> dict[str, Any] | None:
        """As OpenAI's ``response_format`` (``None``: a regex, choice or grammar, which it lacks)."""
        if self.kind == "json_object":
            return {"type": "json_object"}
        if self.kind == "json":
            schema = {"name": "response", "schema": self.value, "strict": True}  # enforced, as vLLM does
            return {"type": "json_schema", "json_schema": schema}
        return None


def bound_problem(value: Any) -> str | None:
    """Why ``value`` (a constraint field's value, as a request holds it) is too large or too deeply
    nested to check (``None``: it may be checked). Walks it without recursion, stopping at the
    first bound passed, so the walk itself is bounded."""
    depth_of, nodes = [(value, 1)], 0
    while depth_of:
        item, depth = depth_of.pop()
        nodes += 1
        if depth > MAX_CONSTRAINT_DEPTH:
            return f"it is nested deeper than {MAX_CONSTRAINT_DEPTH} levels of objects and lists"
        if nodes > MAX_CONSTRAINT_BYTES:  # each node is a byte of JSON at least
            break
        if isinstance(item, dict):
            depth_of += [(v, depth + 1) for v in item.values()]
        elif isinstance(item, list):
            depth_of += [(v, depth + 1) for v in item]
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
    size = len(text.encode()) if nodes <= MAX_CONSTRAINT_BYTES else MAX_CONSTRAINT_BYTES + 1
    if size > MAX_CONSTRAINT_BYTES:
        return f"it is larger than {MAX_CONSTRAINT_BYTES} bytes of JSON"
    return None


def _bounded(value: Any) -> None:
    if (why := bound_problem(value)) is not None:
        raise ValueError(f"{why}: give a smaller constraint")


def _json_schema(value: Any) -> Any:
    """A ``json`` constraint's schema: an object, or JSON text of one."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except RecursionError:
            raise ValueError(f"json text is nested deeper than {MAX_CONSTRAINT_DEPTH} levels") from None
        except ValueError as exc:
            raise ValueError(f"json is not JSON text of a schema ({exc})") from None
        _bounded(value)
    if not isinstance(value, dict):
        raise ValueError(f"json must be a JSON Schema object, got {type(value).__name__}")
    return value


def _check_schema(schema: Mapping[str, Any], where: str) -> None:
    from jsonschema import exceptions, validators  # a dependency; loaded on the first check

    try:
        validators.validator_for(schema).check_schema(schema)
    except exceptions.SchemaError as exc:
        raise ValueError(f"{where} is not a valid JSON Schema: {exc.message}") from None


def from_structured_outputs(value: Mapping[str, Any]) -> StructuredOutput:
    """The constraint of a ``structured_outputs`` object (of its schema); ``ValueError`` naming what
    is wrong with it."""
    _bounded(value)
    if not isinstance(value, Mapping) or len(value) != 1 or next(iter(value)) not in KINDS:
        got = sorted(value) if isinstance(value, Mapping) else type(value).__name__
        raise ValueError(f"give exactly one of {', '.join(KINDS)}, got {got!r}")
    ((kind, spec),) = value.items()
    if kind == "choice" and not (isinstance(spec, list) and spec and all(isinstance(c, str) for c in spec)):
        raise ValueError("choice must be a non-empty list of strings")
    if kind in ("regex", "grammar") and not (isinstance(spec, str) and spec):
        raise ValueError(f"{kind} must be non-empty text")
    if kind == "json":
        schema = _json_schema(spec)
        _check_schema(schema, "json")
        return StructuredOutput("json", _canonical(_schema_order(schema)))
    if kind == "regex":
        try:
            re.compile(spec)
        except re.error as exc:
            raise ValueError(f"regex does not compile: {exc}") from None
    if kind == "json_object":
        spec = True
    return StructuredOutput(kind, _canonical(spec))


def from_response_format(value: Mapping[str, Any]) -> StructuredOutput | None:
    """The constraint of a ``response_format`` object (of its schema; ``None``: ``text``, no
    constraint); ``ValueError`` naming what is wrong with it."""
    _bounded(value)
    kind = value.get("type") if isinstance(value, Mapping) else None
    if kind not in ("text", "json_object", "json_schema"):
        raise ValueError(f"type must be text, json_object or json_schema, got {kind!r}")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput("json_object", "true")
    schema = (value.get("json_schema") or {}).get("schema")
    if not isinstance(schema, dict):
        raise ValueError("json_schema needs a schema (a JSON Schema object)")
    _check_schema(schema, "json_schema.schema")
    return StructuredOutput("json", _canonical(_schema_order(schema)))


def problem(name: str, value: Any) -> str | None:
    """Why ``value`` (of its field's schema) of ``structured_outputs`` or ``response_format`` cannot
    constrain an answer (``None``: it can)."""
    read = from_structured_outputs if name == "structured_outputs" else from_response_format
    try:
        read(value)
    except ValueError as exc:
        return f"{name}: {exc}"
    return None


def read(values: Mapping[str, Any]) -> StructuredOutput | None:
    """The constraint ``values`` (a request body or the ``sampling`` param, its fields of their
    schemas) asks for (``None``: none, or ``response_format`` ``text``); ``ValueError`` when both
    fields are given and ask for different things."""
    so, rf = values.get("structured_outputs"), values.get("response_format")
    a = from_structured_outputs(so) if so is not None else None
    b = from_response_format(rf) if rf is not None else None
    if a is not None and b is not None and a != b:
        raise ValueError(
            f"structured_outputs ({a.kind}) and response_format ({b.kind}) ask for different constraints: "
            "give one of them"
        )
    if so is not None and rf is not None and b is None:
        raise ValueError(
            "structured_outputs and response_format (text, no constraint) ask for different things: "
            "give one of them"
        )
    return a or b
