"""Judges: decide approved/rejected per record. ``build_judge(spec)`` builds one from a JSON spec.

Spec examples::

    {"type": "llm", "template": "...", "max_tokens": 128}  # "verdict_schema": false: never a schema
    {"type": "llm", "score": "logprob"}    # scored P(approve) from the verdict token's logprobs
    {"type": "expected_answer", "field": "answer", "match": "number"}
    {"type": "regex", "pattern": "^\\\\d+$"}
    {"type": "json_schema", "schema": {...}}
    {"type": "length", "min_chars": 1, "max_chars": 2000}
    {"type": "callable", "target": "my_pkg.checks:is_good"}
    {"type": "all", "judges": [...]}       # or "any"

``callable`` targets are checked against a :class:`CallablePolicy` before anything is imported (a
worker allows those it was started with, ``--allow-callable``); ``regex`` and ``json_schema``
patterns run on RE2 (linear time).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_batchinfer.engines.base import SamplingParams
from airflow_batchinfer.engines.sampling import refusals
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges.base import Judge, JudgeItem, Verdict
from airflow_batchinfer.judges.human import HumanJudge, judges_in_place, require_judge_in_place
from airflow_batchinfer.judges.llm import DEFAULT_TEMPLATE, LLMJudge, parse_verdict
from airflow_batchinfer.judges.rules import (
    CallableJudge,
    CallablePolicy,
    Combined,
    ExpectedAnswer,
    JsonSchemaJudge,
    LengthJudge,
    RegexJudge,
)

LLM_JUDGE_KEYS = frozenset(
    {
        "template",
        "system",
        "sampling",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "seed",
        "stop",
        "verdict_schema",
        "score",
    }
)
JUDGE_TYPES = ("llm", "expected_answer", "regex", "json_schema", "length", "callable", "all", "any", "human")


def build_judge(
    spec: Mapping[str, Any], *, callables: CallablePolicy | None, engine: str | None = None
) -> Judge:
    """The judge ``spec`` describes (ConfigError naming the problem otherwise).

    :param callables: which ``callable`` judge targets may be imported, checked before any import;
        ``None`` allows every target (the caller's explicit choice; workers pass their
        ``--allow-callable`` policy, which allows none by default).
    :param engine: the engine the judge's worker runs (``None``: not known): an ``llm`` judge asks
        for its verdict as a JSON schema where that engine honours structured outputs.
    """
    if not isinstance(spec, Mapping) or "type" not in spec:
        raise ConfigError(
            f"judge spec must be an object with a 'type' ({', '.join(JUDGE_TYPES)}), got {spec!r}"
        )
    kind = spec["type"]
    args = {k: v for k, v in spec.items() if k != "type"}
    try:
        if kind == "llm":
            unknown = set(args) - LLM_JUDGE_KEYS
            if unknown:
                raise ConfigError(
                    f"llm judge: unknown keys {sorted(unknown)}; it takes {sorted(LLM_JUDGE_KEYS)}"
                )
            refused = refusals(args.get("sampling") or {}, in_body=False)  # read, or refused: never dropped
            if refused:
                raise ConfigError(f"llm judge: {'; '.join(refused)}")
            # Sampling as an object (like the run's `sampling`) or at the top level (which wins).
            values = {**(args.get("sampling") or {}), **args}
            sampling = SamplingParams.from_mapping(values, SamplingParams(max_tokens=128, temperature=0.0))
            verdict_schema = args.get("verdict_schema", True)
            if not isinstance(verdict_schema, bool):
                raise ConfigError(f"llm judge: verdict_schema must be true or false, got {verdict_schema!r}")
            return LLMJudge(
                args.get("template") or DEFAULT_TEMPLATE,
                system=args.get("system"),
                sampling=sampling,
                engine=engine,
                verdict_schema=verdict_schema,
                score=args.get("score", "verdict"),
            )
        if kind == "human":
            if args:
                raise ConfigError(f"human judge: takes no fields, got {sorted(args)}")
            return HumanJudge()
        if kind in ("all", "any"):
            return Combined(
                kind, [build_judge(s, callables=callables, engine=engine) for s in args.get("judges", [])]
            )
        if kind == "callable":
            return CallableJudge(**args, policy=callables)
        cls = {
            "expected_answer": ExpectedAnswer,
            "regex": RegexJudge,
            "json_schema": JsonSchemaJudge,
            "length": LengthJudge,
        }.get(kind)
        if cls is None:
            raise ConfigError(f"judge type {kind!r} is unknown: choose one of {', '.join(JUDGE_TYPES)}")
        judge: Judge = cls(**args)
        return judge
    except TypeError as exc:
        raise ConfigError(f"judge {kind!r}: bad arguments {sorted(args)} ({exc})") from exc


__all__ = [
    "JUDGE_TYPES",
    "CallablePolicy",
    "HumanJudge",
    "Judge",
    "JudgeItem",
    "LLMJudge",
    "Verdict",
    "build_judge",
    "judges_in_place",
    "parse_verdict",
    "require_judge_in_place",
]
