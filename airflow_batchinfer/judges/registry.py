"""The judge types, and the judge a JSON spec describes: ``build_judge(spec)``.

Spec examples::

    {"type": "llm", "template": "...", "max_tokens": 128}  # "verdict_schema": false: never a schema
    {"type": "llm", "score": "logprob"}    # scored P(approve) from the verdict token's logprobs
    {"type": "llm", "sees_reasoning": true}   # the prompt shows the answer's reasoning too
    {"type": "expected_answer", "field": "answer", "match": "number"}
    {"type": "regex", "pattern": "^\\\\d+$"}
    {"type": "json_schema", "schema": {...}}
    {"type": "length", "min_chars": 1, "max_chars": 2000}
    {"type": "tool_call", "name": "get_weather", "arguments": {"required": ["city"]}}
    {"type": "length", "max_chars": 8000, "of": "reasoning"}   # a rule over the reasoning, not the answer
    {"type": "callable", "target": "my_pkg.checks:is_good"}
    {"type": "all", "judges": [...]}       # or "any"
    {"type": "classifier", "threshold": 0.5, "label": "POSITIVE"}   # a scoring model's P(label)
    {"type": "reward", "threshold": 0.0}   # a reward model's raw score
    {"type": "jury", "judges": [...], "vote": "majority"}   # or "all", "mean_score" (+ "threshold")
    {"type": "label", "keep_labels": ["POSITIVE"]}   # a classify run's filter (judges.pooled)
    {"type": "accept"}                     # every computed row kept (an embed or score run)

``callable`` targets are checked against a :class:`CallablePolicy` before anything is imported (a
worker allows those it was started with, ``--allow-callable``); ``regex`` and ``json_schema``
patterns run on RE2 (linear time).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Literal

from airflow_batchinfer.engines.base import SamplingParams
from airflow_batchinfer.engines.sampling import refusals
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges.base import Judge
from airflow_batchinfer.judges.human import HumanJudge
from airflow_batchinfer.judges.jury import JURY_KEYS, Jury, Member, member_names
from airflow_batchinfer.judges.llm import DEFAULT_TEMPLATE, LLMJudge
from airflow_batchinfer.judges.models import MODEL_JUDGES, build_model_judge
from airflow_batchinfer.judges.pooled import AcceptJudge, LabelJudge
from airflow_batchinfer.judges.reasoning import REASONING_TEMPLATE, OfReasoning, check_of
from airflow_batchinfer.judges.rules import (
    CallableJudge,
    CallablePolicy,
    Combined,
    ExpectedAnswer,
    JsonSchemaJudge,
    LengthJudge,
    RegexJudge,
)
from airflow_batchinfer.judges.tool_calls import ToolCallJudge

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
        "sees_reasoning",
    }
)
JUDGE_TYPES = (
    "llm",
    "expected_answer",
    "regex",
    "json_schema",
    "length",
    "tool_call",
    "callable",
    "all",
    "any",
    "human",
    "classifier",
    "reward",
    "jury",
    "label",
    "accept",
)
RULES = ("expected_answer", "regex", "json_schema", "length", "callable")  # judges of one text: "of" picks it
NESTING = ("all", "any", "jury")  # judge types whose spec holds judges ("judges")
UNIT_SCORES = ("llm", "classifier", "jury")  # judge types whose verdicts carry a score in [0, 1]
# judge types whose scores are on their model's own scale: not bucketed by tenths (judges.spot_check)
RAW_SCORES = ("reward",)
Need = Literal["generate", "score"]


def judge_specs(spec: Any) -> Iterator[Mapping[str, Any]]:
    """``spec`` and every judge spec nested in it (``all``, ``any``, ``jury``), depth first; what is
    no judge spec is skipped (``build_judge`` refuses it)."""
    if not isinstance(spec, Mapping):
        return
    yield spec
    if spec.get("type") in NESTING and isinstance(spec.get("judges"), list):
        for inner in spec["judges"]:
            yield from judge_specs(inner)


def judge_needs(spec: Any) -> frozenset[Need]:
    """The kinds of model the judge ``spec`` asks of a worker: ``generate`` (an ``llm`` judge) and
    ``score`` (a ``reward`` or ``classifier`` judge), nested judges included; none for rule judges."""
    found: set[Need] = set()
    for s in judge_specs(spec):
        if s.get("type") == "llm":
            found.add("generate")
        elif s.get("type") in MODEL_JUDGES:
            found.add("score")
    return frozenset(found)


def judged_early(spec: Any) -> bool:
    """Whether some members of the judge ``spec`` are judged where the answers are generated: the
    llm members of a jury that holds a model judge (:mod:`~airflow_batchinfer.judges.jury`)."""
    if not isinstance(spec, Mapping) or spec.get("type") != "jury":
        return False
    return any(_early(spec.get("judges") or []))


def _early(members: list[Any]) -> list[bool]:
    """Which of a jury's ``members`` are judged where the answers are generated: beside a model
    judge (the judge pool then serves a scoring model), those that only generate (llm judges)."""
    scoring = any("score" in judge_needs(m) for m in members)
    return [scoring and judge_needs(m) == {"generate"} for m in members]


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
            verdict_schema, sees = args.get("verdict_schema", True), args.get("sees_reasoning", False)
            for name, flag in (("verdict_schema", verdict_schema), ("sees_reasoning", sees)):
                if not isinstance(flag, bool):
                    raise ConfigError(f"llm judge: {name} must be true or false, got {flag!r}")
            return LLMJudge(
                args.get("template") or (REASONING_TEMPLATE if sees else DEFAULT_TEMPLATE),
                system=args.get("system"),
                sampling=sampling,
                engine=engine,
                verdict_schema=verdict_schema,
                score=args.get("score", "verdict"),
                sees_reasoning=sees,
            )
        if kind == "human":
            if args:
                raise ConfigError(f"human judge: takes no fields, got {sorted(args)}")
            return HumanJudge()
        if kind in ("all", "any"):
            return Combined(
                kind, [build_judge(s, callables=callables, engine=engine) for s in args.get("judges", [])]
            )
        if kind in MODEL_JUDGES:
            return build_model_judge(kind, args)
        if kind == "jury":
            return _jury(args, callables=callables, engine=engine)
        if kind in RULES and check_of(kind, args.pop("of", "answer")):
            return OfReasoning(build_judge({"type": kind, **args}, callables=callables, engine=engine))
        if kind == "callable":
            return CallableJudge(**args, policy=callables)
        cls = {
            "expected_answer": ExpectedAnswer,
            "regex": RegexJudge,
            "json_schema": JsonSchemaJudge,
            "length": LengthJudge,
            "label": LabelJudge,
            "accept": AcceptJudge,
            "tool_call": ToolCallJudge,
        }.get(kind)
        if cls is None:
            raise ConfigError(f"judge type {kind!r} is unknown: choose one of {', '.join(JUDGE_TYPES)}")
        judge: Judge = cls(**args)
        return judge
    except TypeError as exc:
        raise ConfigError(f"judge {kind!r}: bad arguments {sorted(args)} ({exc})") from exc


def _jury(args: Mapping[str, Any], *, callables: CallablePolicy | None, engine: str | None) -> Jury:
    unknown = set(args) - JURY_KEYS
    if unknown:
        raise ConfigError(f"jury judge: unknown keys {sorted(unknown)}; it takes {sorted(JURY_KEYS)}")
    specs = args.get("judges")
    if not isinstance(specs, list) or not all(isinstance(s, Mapping) for s in specs):
        raise ConfigError(f"jury judge: judges must be a list of judge specs, got {specs!r}")
    for s in specs:
        if s.get("type") in ("human", "jury"):
            raise ConfigError(
                f"jury judge: a {s.get('type')} judge cannot be a member (people judge between rounds on "
                "the review page; a jury's members are judges that answer in a job)"
            )
    members = []
    for name, s, early in zip(member_names(specs), specs, _early(specs), strict=True):
        if len(judge_needs(s)) > 1:
            raise ConfigError(
                f"jury member {name} needs both a generating and a scoring model, which no one pool serves: "
                "make its llm and model judges members of the jury of their own"
            )
        inner = build_judge({k: v for k, v in s.items() if k != "name"}, callables=callables, engine=engine)
        members.append(Member(name, str(s.get("type")), inner, early=early))
    return Jury(members, args.get("vote", "majority"), args.get("threshold"))
