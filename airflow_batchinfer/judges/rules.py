"""Rule judges: no model needed. Composable with ``all`` / ``any``.

Patterns (``regex`` judges, ``pattern`` / ``patternProperties`` in ``json_schema`` judges) run on RE2:
linear time in the text, so no pattern and no model output can stall a worker. Checks run in a
thread, off the worker's event loop.
"""

from __future__ import annotations

import abc
import asyncio
import importlib
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_batchinfer.engines.scoring import ScoringModel
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges.base import Generate, Judge, JudgeItem, Scorer, Verdict

_NUMBER = re.compile(r"-?\d+(?:[.,]\d+)*(?:\.\d+)?")  # linear: every alternative ends in a match

ALLOW_CALLABLE_FLAG = "--allow-callable"
ALLOW_CALLABLE_ENV = "BATCHINFER_WORKER_ALLOW_CALLABLE"


def _unfence(text: str) -> str:
    """The body of a Markdown code fence (```json ... ```) around the whole text, else the text."""
    if len(text) >= 6 and text.startswith("```") and text.endswith("```"):
        body = text[3:-3]
        return (body[4:] if body.startswith("json") else body).strip()
    return text


# ----------------------------------------------------------------------------------------- RE2
def _re2_hint(pattern: str) -> str:
    """What to do instead, for the Python-only constructs RE2 refuses (by design: they backtrack)."""
    if re.search(r"\\[1-9]|\(\?P=|\\g<", pattern):
        return (
            "backreferences (\\1, (?P=name)) need a backtracking engine: list the alternatives "
            "explicitly, or check it in a callable judge"
        )
    if re.search(r"\(\?<?[=!]", pattern):
        return (
            "lookaround ((?=...), (?!...), (?<=...), (?<!...)) needs a backtracking engine: match the "
            "context itself (foo(?=bar) becomes foobar), or turn a negative check around with "
            "must_match: false (^(?!.*error) becomes the pattern error with must_match false)"
        )
    if "(?>" in pattern or re.search(r"[*+?}]\+", pattern):
        return "atomic groups and possessive quantifiers are not needed (RE2 never backtracks): drop them"
    if "\\Z" in pattern:
        return "write \\z for the end of the text"
    return ""


def compile_re2(pattern: Any, what: str) -> Any:
    """``pattern`` compiled by RE2 (``google-re2``), or a ConfigError that says why and what to write.

    RE2 runs in time linear in the text (no backtracking), so no pattern can stall a worker. Its
    syntax is Python's except: no backreferences, no lookaround, no atomic groups; ``\\z`` ends the
    text; ``\\d``, ``\\w``, ``\\s`` and ``\\b`` are ASCII-only.
    """
    try:
        import re2  # google-re2 (a core dependency); imported here, as only pattern judges need it
    except ImportError as exc:
        raise ConfigError(
            f"{what}: this worker's environment lacks google-re2, the regex engine pattern judges run "
            "on: install it (pip install google-re2)"
        ) from exc
    if not isinstance(pattern, str):
        raise ConfigError(f"{what}: a pattern must be a string, got {pattern!r}")
    options = re2.Options()
    options.log_errors = False
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else exc
        hint = _re2_hint(pattern)
        raise ConfigError(
            f"{what}: invalid pattern `{pattern}` for RE2, the linear-time regex engine judges use "
            f"(so that no pattern can stall a worker): {reason}" + (f". {hint}" if hint else "")
        ) from None


def _number(text: str) -> float | None:
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


class RuleJudge(Judge):
    """A judge that decides each item on its own, synchronously: the batch is checked in a thread, so
    a slow check (user code, a large document) never blocks the worker's event loop."""

    async def judge(
        self, items: Sequence[JudgeItem], generate: Generate | None = None, scorer: Scorer | None = None
    ) -> list[Verdict]:
        if not items:
            return []
        return await asyncio.to_thread(self.check_all, list(items))

    def check_all(self, items: Sequence[JudgeItem]) -> list[Verdict]:
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
    """Approved when ``pattern`` is found in the output (``must_match``), or not found (``False``).
    RE2 syntax: see :func:`compile_re2`."""

    kind = "regex"

    def __init__(self, pattern: str, must_match: bool = True) -> None:
        self.regex = compile_re2(pattern, "regex judge")
        self.must_match = must_match

    def check(self, item: JudgeItem) -> Verdict:
        found = self.regex.search(item.result) is not None
        ok = found == self.must_match
        return Verdict(ok, f"pattern {'found' if found else 'not found'}")

    def describe(self) -> dict[str, Any]:
        return {"type": self.kind, "pattern": self.regex.pattern, "must_match": self.must_match}


# Schema keywords whose values are data, not subschemas: patterns in them are never run.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})


def _schema_nodes(node: Any) -> Iterator[Mapping[str, Any]]:
    """Every object in a schema document (subschemas, ``$defs``…), data keywords skipped."""
    if isinstance(node, Mapping):
        yield node
        for key, value in node.items():
            if key not in _DATA_KEYWORDS:
                yield from _schema_nodes(value)
    elif isinstance(node, list):
        for value in node:
            yield from _schema_nodes(value)


def _re2_validator(cls: Any, schema: Mapping[str, Any]) -> Any:
    """``cls`` (a jsonschema validator class) with ``pattern``, ``patternProperties`` and
    ``additionalProperties`` evaluated by RE2 instead of Python's backtracking ``re``. Every pattern in
    the schema is compiled now: one RE2 cannot run is a ConfigError."""
    from jsonschema import ValidationError, validators
    from jsonschema._utils import extras_msg

    compiled: dict[str, Any] = {}
    uses_patterns = False
    for node in _schema_nodes(schema):
        found = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
        if isinstance(node.get("patternProperties"), Mapping):
            found += list(node["patternProperties"])
            uses_patterns = True
        for source in found:
            compiled[source] = compile_re2(source, "json_schema judge")
    if uses_patterns and any("unevaluatedProperties" in node for node in _schema_nodes(schema)):
        raise ConfigError(
            "json_schema judge: unevaluatedProperties together with patternProperties is not supported "
            "(jsonschema matches that pair with Python's backtracking regex engine, which one output "
            "could stall): use additionalProperties next to the patternProperties instead"
        )

    def search(pattern: str, text: str) -> bool:
        regex = compiled.get(pattern)
        if regex is None:  # not seen in the schema document (a remote $ref): compile it now
            regex = compiled[pattern] = compile_re2(pattern, "json_schema judge")
        return regex.search(text) is not None

    def pattern(validator: Any, patrn: str, instance: Any, schema: Mapping[str, Any]) -> Iterator[Any]:
        if validator.is_type(instance, "string") and not search(patrn, instance):
            yield ValidationError(f"{instance!r} does not match {patrn!r}")

    def pattern_properties(
        validator: Any, patterns: Mapping[str, Any], instance: Any, schema: Mapping[str, Any]
    ) -> Iterator[Any]:
        if not validator.is_type(instance, "object"):
            return
        for patrn, subschema in patterns.items():
            for key, value in instance.items():
                if search(patrn, key):
                    yield from validator.descend(value, subschema, path=key, schema_path=patrn)

    def additional_properties(
        validator: Any, additional: Any, instance: Any, schema: Mapping[str, Any]
    ) -> Iterator[Any]:
        if not validator.is_type(instance, "object"):
            return
        properties = schema.get("properties", {})
        patterns = list(schema.get("patternProperties", {}))
        extras = [
            key
            for key in instance
            if key not in properties and not any(search(patrn, key) for patrn in patterns)
        ]
        if validator.is_type(additional, "object"):
            for extra in extras:
                yield from validator.descend(instance[extra], additional, path=extra)
        elif not additional and extras:
            if patterns:
                verb = "does" if len(extras) == 1 else "do"
                joined = ", ".join(repr(each) for each in sorted(extras))
                listed = ", ".join(repr(each) for each in sorted(patterns))
                yield ValidationError(f"{joined} {verb} not match any of the regexes: {listed}")
            else:
                error = "Additional properties are not allowed (%s %s unexpected)"
                yield ValidationError(error % extras_msg(sorted(extras, key=str)))

    replaced = {
        "pattern": pattern,
        "patternProperties": pattern_properties,
        "additionalProperties": additional_properties,
    }
    return validators.extend(cls, {k: v for k, v in replaced.items() if k in cls.VALIDATORS})


def schema_validator(schema: Mapping[str, Any], what: str) -> Any:
    """A jsonschema validator of ``schema`` whose patterns run on RE2, or a ConfigError naming
    ``what`` (the judge) when the schema is not a valid JSON Schema."""
    import jsonschema

    try:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        return _re2_validator(cls, schema)(schema)
    except jsonschema.SchemaError as exc:
        raise ConfigError(f"{what}: invalid schema: {exc.message}") from exc
    except RecursionError as exc:
        raise ConfigError(f"{what}: the schema is nested too deeply") from exc


class JsonSchemaJudge(RuleJudge):
    """The output must be JSON (optionally in a ```json fence) valid against ``schema``; its patterns
    run on RE2 (see :func:`compile_re2`)."""

    kind = "json_schema"

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self.validator = schema_validator(schema, "json_schema judge")
        self.schema = dict(schema)

    def check(self, item: JudgeItem) -> Verdict:
        try:
            value = json.loads(_unfence(item.result.strip()))
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


@dataclass(frozen=True)
class CallablePolicy:
    """Which ``callable`` judge targets may be imported (checked before anything is imported).

    An entry allows a target when it equals it (``my_pkg.checks:is_good``), or when it ends with
    ``:`` or ``.`` and the target starts with it: ``my_pkg.checks:`` allows every function of that
    module, ``my_pkg.`` every module under that package (not ``my_pkg:f`` itself). No entries: none
    allowed (a worker's default). Where a caller passes ``None`` instead of a policy, every target is
    allowed: that is an explicit choice of the caller.
    """

    entries: Sequence[str] = ()

    def __post_init__(self) -> None:
        entries = (self.entries,) if isinstance(self.entries, str) else tuple(self.entries)
        for entry in entries:
            if (
                not isinstance(entry, str)
                or not entry
                or any(c == "," or c.isspace() for c in entry)
                or not (":" in entry or entry.endswith("."))
                or entry.startswith((".", ":"))
            ):
                raise ConfigError(
                    f"{ALLOW_CALLABLE_FLAG} {entry!r}: expected a target 'package.module:function', a "
                    "module 'package.module:' or a package 'package.' (no commas or spaces)"
                )
        object.__setattr__(self, "entries", entries)

    def allows(self, target: str) -> bool:
        return any(
            target == entry or (entry.endswith((".", ":")) and target.startswith(entry))
            for entry in self.entries
        )


class CallableJudge(RuleJudge):
    """``module:function`` called as ``function(record, result)``; it returns a bool, a
    ``(bool, reason)`` pair, a ``{"approved", "reason", "score"}`` dict or a :class:`Verdict`.

    :param policy: the targets that may be imported (``None``: any, by the caller's explicit choice);
        a target it does not allow is a ConfigError, before anything is imported.
    """

    kind = "callable"

    def __init__(self, target: str, *, policy: CallablePolicy | None) -> None:
        if not isinstance(target, str):
            raise ConfigError(f"callable judge target must be a string, got {target!r}")
        module, sep, attr = target.partition(":")
        if not sep or not module or not attr:
            raise ConfigError(f"callable judge {target!r}: expected 'package.module:function'")
        if policy is not None and not policy.allows(target):
            raise ConfigError(
                f"callable judge {target!r} is not allowed: a worker imports only the targets it was "
                f"started with ({ALLOW_CALLABLE_FLAG} {target}, repeatable, or a module 'pkg.mod:' or "
                f"package 'pkg.' prefix; env {ALLOW_CALLABLE_ENV}, comma-separated)"
            )
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

    async def judge(
        self, items: Sequence[JudgeItem], generate: Generate | None = None, scorer: Scorer | None = None
    ) -> list[Verdict]:
        columns = [await j.judge(items, generate, scorer) for j in self.judges]
        out = []
        for verdicts in zip(*columns, strict=True):
            combine = all if self.kind == "all" else any
            approved = combine(v.approved for v in verdicts)
            reasons = "; ".join(v.reason for v in verdicts if v.approved == approved and v.reason)
            out.append(Verdict(approved, reasons))
        return out

    def serving_refusal(self, scoring: ScoringModel | None) -> str | None:
        return next((r for j in self.judges if (r := j.serving_refusal(scoring)) is not None), None)

    def describe(self) -> dict[str, Any]:
        return {"type": self.kind, "judges": [j.describe() for j in self.judges]}
