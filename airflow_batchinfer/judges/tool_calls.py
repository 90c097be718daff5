"""The ``tool_call`` rule judge: approves an answer that calls a named function with arguments that
are a JSON object (and valid against a JSON Schema, when given). It reads the calls the engine
parsed (a row's ``tool_calls``, :mod:`~airflow_batchinfer.engines.tools`); nothing is executed.

Spec::

    {"type": "tool_call", "name": "get_weather"}                         # one name, or a list
    {"type": "tool_call", "name": ["search", "lookup"],
     "arguments": {"type": "object", "required": ["query"]}}             # a JSON Schema (RE2 patterns)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges.base import JudgeItem, Verdict
from airflow_batchinfer.judges.rules import RuleJudge, schema_validator


class ToolCallJudge(RuleJudge):
    """Approves when one of the answer's calls names a function of ``name`` and its arguments are a
    JSON object valid against ``arguments`` (a JSON Schema; ``None``: any object). Rejects an answer
    without calls, or whose calls name other functions, or whose arguments are not JSON (saying so)."""

    kind = "tool_call"

    def __init__(self, name: str | Sequence[str], arguments: Mapping[str, Any] | None = None) -> None:
        names = [name] if isinstance(name, str) else list(name) if isinstance(name, list | tuple) else []
        if not names or not all(isinstance(n, str) and n for n in names):
            raise ConfigError(
                f"tool_call judge: name must be a function's name or a list of them, got {name!r}"
            )
        if arguments is not None and not isinstance(arguments, Mapping):
            raise ConfigError(
                f"tool_call judge: arguments must be a JSON Schema (an object), got {arguments!r}"
            )
        self.names = tuple(names)
        self.arguments = None if arguments is None else dict(arguments)
        self.validator = None if arguments is None else schema_validator(arguments, "tool_call judge")

    def check(self, item: JudgeItem) -> Verdict:
        calls = item.tool_calls or ()
        if not calls:
            return Verdict(False, f"no tool call (expected {self._expected()})")
        named = [c for c in calls if c.name in self.names]
        if not named:
            made = ", ".join(c.name for c in calls)
            return Verdict(False, f"called {made}, not {self._expected()}")
        reasons = []
        for call in named:
            value, why = call.parsed_arguments()
            if why is None and self.validator is not None:
                error = next(iter(self.validator.iter_errors(value)), None)
                why = None if error is None else f"the arguments of {call.name}: schema: {error.message}"
            if why is None:
                return Verdict(True, f"called {call.name}")
            reasons.append(why)
        return Verdict(False, reasons[0])

    def _expected(self) -> str:
        return " or ".join(self.names)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.kind, "name": list(self.names)}
        if self.arguments is not None:
            out["arguments"] = self.arguments
        return out
