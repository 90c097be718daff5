"""Tool calls, step one: the tools a request offers the model (OpenAI's ``tools``, ``tool_choice``,
``parallel_tool_calls``) and the calls its answer makes (:class:`ToolCall`). Nothing here runs a
tool: an answer's calls are recorded, judged and written out, and no tool's result goes back to the
model (multi-turn rollouts are a later step).

The request side is carried on :class:`~airflow_batchinfer.engines.base.SamplingParams` in hashable
frozen forms (:class:`Tool`, :class:`NamedTool`) whose ``as_json`` gives OpenAI's objects back.
This module imports nothing heavy (the run settings and the worker side both import it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: The SamplingParams fields that shape the prompt and parse the answer, not the sampler's.
TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls")

#: The modes ``tool_choice`` may name (an object names one function instead).
TOOL_CHOICE_MODES = ("none", "auto", "required")

_NAME = {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,64}$"}

#: OpenAI's ``tools``: function tools, each with a name and its parameters' JSON Schema (an object).
TOOLS_SCHEMA: dict[str, Any] = {
    "type": ["array", "null"],
    "items": {
        "type": "object",
        "required": ["type", "function"],
        "additionalProperties": False,
        "properties": {
            "type": {"const": "function"},
            "function": {
                "type": "object",
                "required": ["name"],
                "additionalProperties": False,
                "properties": {
                    "name": _NAME,
                    "description": {"type": "string"},
                    "parameters": {"type": "object"},
                    "strict": {"type": ["boolean", "null"]},
                },
            },
        },
    },
}

#: OpenAI's ``tool_choice``: a mode, or ``{"type": "function", "function": {"name": ...}}``.
TOOL_CHOICE_SCHEMA: dict[str, Any] = {
    "type": ["string", "object", "null"],
    "anyOf": [
        {"type": "null"},
        {"enum": list(TOOL_CHOICE_MODES)},
        {
            "type": "object",
            "required": ["type", "function"],
            "additionalProperties": False,
            "properties": {
                "type": {"const": "function"},
                "function": {
                    "type": "object",
                    "required": ["name"],
                    "additionalProperties": False,
                    "properties": {"name": _NAME},
                },
            },
        },
    ],
}


@dataclass(frozen=True)
class Tool:
    """One function tool: its ``name`` and ``spec``, the whole tool object as canonical JSON text
    (sorted keys: equal tools are equal, and hash alike)."""

    name: str
    spec: str

    @classmethod
    def of(cls, value: Mapping[str, Any]) -> Tool:
        """The tool of OpenAI's object ``value`` (checked against :data:`TOOLS_SCHEMA` first)."""
        return cls(str(value["function"]["name"]), json.dumps(value, sort_keys=True, separators=(",", ":")))

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.spec)
        return out

    @property
    def parameters(self) -> dict[str, Any] | None:
        """Its parameters' JSON Schema (``None``: it declares none)."""
        params = self.as_json()["function"].get("parameters")
        return dict(params) if isinstance(params, Mapping) else None


@dataclass(frozen=True)
class NamedTool:
    """A ``tool_choice`` that names the one function the answer must call."""

    name: str

    def as_json(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name}}


ToolChoice = str | NamedTool  # a mode of TOOL_CHOICE_MODES, or one named function


def read_tools(value: Sequence[Mapping[str, Any]] | None) -> tuple[Tool, ...]:
    return tuple(Tool.of(t) for t in value or ())


def read_tool_choice(value: str | Mapping[str, Any] | None) -> ToolChoice | None:
    if value is None or isinstance(value, str):
        return value
    return NamedTool(str(value["function"]["name"]))


def tool_changes(values: Mapping[str, Any], tools: tuple[Tool, ...]) -> dict[str, Any]:
    """The tool fields ``values`` (a ``sampling`` param, a request body) sets on sampling that
    offered ``tools``. Without tools, ``none``, ``auto`` and parallel calls ask for nothing: they are
    not carried (so the job ids of requests that name them stay what they were)."""
    changes: dict[str, Any] = {}
    if values.get("tools") is not None:
        changes["tools"] = read_tools(values["tools"])
    offered = bool(changes.get("tools", tools))
    choice = read_tool_choice(values.get("tool_choice"))
    if choice is not None and (offered or choice not in ("none", "auto")):
        changes["tool_choice"] = choice
    if values.get("parallel_tool_calls") is not None and offered:
        changes["parallel_tool_calls"] = bool(values["parallel_tool_calls"])
    return changes


def choice_problem(tools: Sequence[Tool], tool_choice: ToolChoice | None) -> str | None:
    """Why ``tool_choice`` cannot go with ``tools`` (``None``: it can): a call required, or a
    function named, among no tools or tools without that name."""
    if isinstance(tool_choice, str) and tool_choice not in TOOL_CHOICE_MODES:
        return f"tool_choice {tool_choice!r}: choose one of {', '.join(TOOL_CHOICE_MODES)} or name a function"
    names = [t.name for t in tools]
    if len(set(names)) < len(names):
        return f"tools name a function twice ({', '.join(sorted(names))}): give each function once"
    if tool_choice == "required" and not tools:
        return 'tool_choice "required" asks for a call, but the request offers no tools: give tools'
    if isinstance(tool_choice, NamedTool) and tool_choice.name not in names:
        offered = ", ".join(names) or "none"
        return f"tool_choice names the function {tool_choice.name!r}, which tools do not offer ({offered})"
    return None


@dataclass(frozen=True)
class ToolCall:
    """One call an answer makes: its ``id``, the function's ``name`` and its ``arguments``, the JSON
    text the model wrote (kept as written: a judge says when it is not JSON)."""

    id: str
    name: str
    arguments: str

    def as_json(self) -> dict[str, Any]:
        """OpenAI's form: ``{id, type: "function", function: {name, arguments}}``."""
        function = {"name": self.name, "arguments": self.arguments}
        return {"id": self.id, "type": "function", "function": function}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> ToolCall:
        """A call in OpenAI's form (``arguments`` an object is taken as its JSON text)."""
        function = value["function"]
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
        return cls(str(value.get("id") or ""), str(function["name"]), arguments)

    def parsed_arguments(self) -> tuple[Any, str | None]:
        """The arguments as JSON, or why they are not a JSON object: ``(value, None)`` or
        ``(None, reason)``."""
        try:
            value = json.loads(self.arguments)
        except ValueError as exc:
            return None, f"the arguments of {self.name} are not JSON ({exc}): {self.arguments[:120]!r}"
        if not isinstance(value, dict):
            return None, f"the arguments of {self.name} are not a JSON object: {self.arguments[:120]!r}"
        return value, None


def calls_json(calls: Sequence[ToolCall] | None) -> list[dict[str, Any]] | None:
    """``calls`` in OpenAI's list form (``None``: the answer made none)."""
    return [c.as_json() for c in calls] if calls else None


def calls_of(value: Sequence[Mapping[str, Any]] | None) -> tuple[ToolCall, ...] | None:
    """The calls of OpenAI's list ``value`` (a row's ``tool_calls``, a message's); ``None``: none."""
    return tuple(ToolCall.from_json(c) for c in value) if value else None
