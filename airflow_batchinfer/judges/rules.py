"""Rule judges: no model needed. Composable with ``all`` / ``any``."""

from __future__ import annotations

import abc
import importlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges.base import Generate, Judge, JudgeItem, Verdict

_NUMBER = re.compile(r"-?\d+(?:[.,]\d+)*(?:\.\d+)?")
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def _number(text: str) -> float | None:
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


class RuleJudge(Judge):
    """A judge that decides each item on its own, synchronously."""

    async def judge(self, items: Sequence[JudgeItem], generate: Generate | None = None) -> list[Verdict]:
        out = []
        for item in items:
            try:
                out.append(self.check(item))
            except Exception as exc:  # a rule that breaks on one record rejects that record only
                out.append(Verdict(False, f"judge_error: {type(exc).__name__}: {exc}"))
        return out

    @abc.abstractmethod
    def check(self, item: JudgeItem) -> Verdict:
        """The verdict for one item (exceptions become a rejection of that item)."""


class ExpectedAnswer(RuleJudge):
    """Compares the output with ``record[field]``.

    ``match``: ``number`` (the last number in the output equals the expected number; for arithmetic
    and math datasets), ``exact`` (whole output, trimmed), or ``contains``.
    """

    kind = "expected_answer"

    def __init__(self, field: str = "answer", match: str = "exact", case_sensitive: bool = False) -> None:
        if match not in ("exact", "contains", "number"):
            raise ConfigError(f"expected_answer match={match!r}: use exact, contains or number")
        self.field, self.match, self.case_sensitive = field, match, case_sensitive

    def check(self, item: JudgeItem) -> Verdict:
        if self.field not in item.record:
            return Verdict(False, f"record has no {self.field!r} field to compare with")
        expected = item.record[self.field]
        if self.match == "number":
            got = _number(item.result)
            want = expected if isinstance(expected, int | float) else _number(str(expected))
            if got is None:
                return Verdict(False, "no number in the output")
            ok = want is not None and abs(got - float(want)) < 1e-9
            return Verdict(ok, "correct" if ok else f"expected {expected}, got {got:g}")
        want_s, got_s = str(expected).strip(), item.result.strip()
        if not self.case_sensitive:
            want_s, got_s = want_s.lower(), got_s.lower()
        ok = want_s == got_s if self.match == "exact" else want_s in got_s
        return Verdict(ok, "matches expected answer" if ok else f"expected {expected!r}")

    def describe(self) -> dict[str, Any]:
        return {
            "type": self.kind,
            "field": self.field,
            "match": self.match,
            "case_sensitive": self.case_sensitive,
        }


class RegexJudge(RuleJudge):
    kind = "regex"

    def __init__(self, pattern: str, must_match: bool = True) -> None:
        try:
            self.regex = re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"regex judge: invalid pattern {pattern!r}: {exc}") from exc
        self.must_match = must_match

    def check(self, item: JudgeItem) -> Verdict:
        found = self.regex.search(item.result) is not None
        ok = found == self.must_match
        return Verdict(ok, f"pattern {'found' if found else 'not found'}")

    def describe(self) -> dict[str, Any]:
        return {"type": self.kind, "pattern": self.regex.pattern, "must_match": self.must_match}


class JsonSchemaJudge(RuleJudge):
    """The output must be JSON (optionally in a ```json fence) valid against ``schema``."""

    kind = "json_schema"

    def __init__(self, schema: Mapping[str, Any]) -> None:
        import jsonschema

        try:
            cls = jsonschema.validators.validator_for(schema)
            cls.check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise ConfigError(f"json_schema judge: invalid schema: {exc.message}") from exc
        self.schema = dict(schema)
        self.validator = cls(schema)

    def check(self, item: JudgeItem) -> Verdict:
        text = item.result.strip()
        fenced = _FENCE.match(text)
        try:
            value = json.loads(fenced.group(1) if fenced else text)
        except ValueError as exc:
            return Verdict(False, f"output is not JSON: {exc}")
        error = next(iter(self.validator.iter_errors(value)), None)
        return Verdict(True, "valid") if error is None else Verdict(False, f"schema: {error.message}")

    def describe(self) -> dict[str, Any]:
        return {"type": self.kind, "schema": self.schema}


class LengthJudge(RuleJudge):
    kind = "length"

    def __init__(self, min_chars: int = 0, max_chars: int | None = None) -> None:
        if min_chars < 0 or (max_chars is not None and max_chars < min_chars):
            raise ConfigError(f"length judge: need 0 <= min_chars <= max_chars, got {min_chars}, {max_chars}")
        self.min_chars, self.max_chars = min_chars, max_chars

    def check(self, item: JudgeItem) -> Verdict:
        n = len(item.result.strip())
        if n < self.min_chars:
            return Verdict(False, f"too short ({n} < {self.min_chars} chars)")
        if self.max_chars is not None and n > self.max_chars:
            return Verdict(False, f"too long ({n} > {self.max_chars} chars)")
        return Verdict(True, "length ok")

    def describe(self) -> dict[str, Any]:
        return {"type": self.kind, "min_chars": self.min_chars, "max_chars": self.max_chars}


class CallableJudge(RuleJudge):
    """``module:function`` called as ``function(record, result)``; it returns a bool, a
    ``(bool, reason)`` pair, a ``{"approved", "reason", "score"}`` dict or a :class:`Verdict`."""

    kind = "callable"

    def __init__(self, target: str) -> None:
        module, sep, attr = target.partition(":")
        if not sep or not module or not attr:
            raise ConfigError(f"callable judge {target!r}: expected 'package.module:function'")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"callable judge {target!r}: cannot import it on this worker ({exc})") from exc
        if not callable(fn):
            raise ConfigError(f"callable judge {target!r} is not callable")
        self.target = target
        self.fn: Callable[[Mapping[str, Any], str], Any] = fn

    def check(self, item: JudgeItem) -> Verdict:
        out = self.fn(item.record, item.result)
        if isinstance(out, Verdict):
            return out
        if isinstance(out, bool):
            return Verdict(out, "callable")
        if isinstance(out, tuple) and len(out) == 2:
            return Verdict(bool(out[0]), str(out[1]))
        if isinstance(out, Mapping) and isinstance(out.get("approved"), bool):
            score = out.get("score")
            return Verdict(
                out["approved"], str(out.get("reason", "")), float(score) if score is not None else None
            )
        return Verdict(False, f"judge_error: {self.target} returned {type(out).__name__}, not a verdict")

    def describe(self) -> dict[str, Any]:
        return {"type": self.kind, "target": self.target}


class Combined(Judge):
    """``all``: approved when every judge approves; ``any``: when at least one does."""

    def __init__(self, kind: str, judges: Sequence[Judge]) -> None:
        if kind not in ("all", "any") or not judges:
            raise ConfigError("a combined judge needs type 'all' or 'any' and at least one judge")
        self.kind = kind  # type: ignore[misc]
        self.judges = list(judges)

    async def judge(self, items: Sequence[JudgeItem], generate: Generate | None = None) -> list[Verdict]:
        columns = [await j.judge(items, generate) for j in self.judges]
        out = []
        for verdicts in zip(*columns, strict=True):
            combine = all if self.kind == "all" else any
            approved = combine(v.approved for v in verdicts)
            reasons = "; ".join(v.reason for v in verdicts if v.approved == approved and v.reason)
            out.append(Verdict(approved, reasons))
        return out

    def describe(self) -> dict[str, Any]:
        return {"type": self.kind, "judges": [j.describe() for j in self.judges]}
