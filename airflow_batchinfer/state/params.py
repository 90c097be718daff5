"""A job's parameters: :class:`JobParams`, what the client asks for and the wire carries (a job's
``params``), and :class:`JobSetup`, what a worker makes of them per kind, validated at submit time
(:func:`parse_params`: a bad job is an HTTP 400, not a failed run)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

from airflow_batchinfer.engines.adapters import Adapter, parse_adapters
from airflow_batchinfer.engines.base import SamplingParams
from airflow_batchinfer.engines.pooling import GENERATE, check_task
from airflow_batchinfer.engines.sampling import refusals
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges import (
    CallablePolicy,
    Judge,
    Jury,
    build_judge,
    judge_needs,
    require_judge_in_place,
)
from airflow_batchinfer.judges.candidates import DEFAULT_SELECT, check_select
from airflow_batchinfer.judges.human import HumanJudge
from airflow_batchinfer.judges.spot_check import SpotCheck
from airflow_batchinfer.judges.truncation import DEFAULT_FACTOR, DEFAULT_MODE, TruncationPolicy
from airflow_batchinfer.prompts.build import PromptBuilder
from airflow_batchinfer.prompts.retries import RetrySettings
from airflow_batchinfer.storage.ranges import InputRange

DEFAULT_CHUNK = 2_000

# The params that every job of their kinds carried before :class:`JobParams`, also at their defaults
# (``prompt_template`` None, ``sampling`` {}): sent whenever the client sets them, so those jobs keep
# their ids. Every other param is left out at its default.
SENT_WHEN_SET = (
    "prompt_template", "system", "sampling", "chunk_size", "id_field", "judge", "round", "input_records",
    "max_attempts",
)  # fmt: skip


class JobParams(BaseModel):
    """A job's params as the client builds them (:class:`~airflow_batchinfer.state.config.RunConfig`'s
    ``infer_params`` and the like, :func:`~airflow_batchinfer.run.jobs.job_spec`) and the worker reads
    them (:func:`parse_params`, whose :class:`JobSetup` takes its defaults from here). On the wire
    (:meth:`wire`) a param at its default is left out, but those of :data:`SENT_WHEN_SET`, so a new
    param with a default changes no existing job's id or fingerprint; a deliberate change of every
    job id bumps :data:`~airflow_batchinfer.rpc.fingerprint.FINGERPRINT_VERSION`. The values are
    checked by the worker (:func:`parse_params`) and, before a run starts, by ``RunConfig.validate``.
    Strict: nothing is coerced (a ``"5"`` is refused, not sent as 5), and numbers keep their type
    (``int | float``: 3 stays 3 on the wire, as it was)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    # the records and their prompts; what is done with them (engines.pooling: generate, embed...)
    task: str = GENERATE
    prompt_template: str | None = None
    system: str | None = None
    sampling: dict[str, Any] = {}
    chunk_size: int = DEFAULT_CHUNK
    id_field: str = "id"
    adapters: dict[str, str] = {}
    # retries that use feedback (prompts.retries): only those set
    retry_template: str | None = None
    retry_system: str | None = None
    retry_sampling: dict[str, dict[str, Any]] = {}
    # completions cut at max_tokens (judges.truncation)
    truncated: str = DEFAULT_MODE
    truncated_max_tokens_factor: int | float = DEFAULT_FACTOR
    max_tokens_cap: int | None = None
    # the judge; an infer job's jury whose llm members it judges where it generates
    judge: dict[str, Any] | None = None
    jury_at_inference: dict[str, Any] | None = None
    review_below_score: int | float | None = None
    select: str = DEFAULT_SELECT
    spot_check: dict[str, Any] | None = None
    max_attempts: int = 3
    # the shard: its round, records and (a round-0 range shard) the range it reads
    round: int = 0
    input_records: int | None = None
    input_range: dict[str, Any] | None = None
    # the input file's version (rpc.fingerprint.pin_input sets it on the wire, when the job is submitted)
    input_version: str | None = None
    # what no run sets (a job built by hand may): prompts as chat or as text, an infer job's rows or
    # OpenAI batch output, an in_place job's checkpoints (rows, seconds)
    chat: bool = True
    output_format: str = "rows"
    checkpoint_every: int = 256
    checkpoint_interval_s: int | float = 5.0

    def wire(self) -> dict[str, Any]:
        """The params a job spec carries: each set one of :data:`SENT_WHEN_SET`, and every other one
        that differs from its default."""
        out = {}
        for name, info in type(self).model_fields.items():
            value = getattr(self, name)
            if (name in SENT_WHEN_SET and name in self.model_fields_set) or value != info.get_default(
                call_default_factory=True
            ):
                out[name] = value
        return out

    def merge(self, other: JobParams) -> JobParams:
        """These params with those ``other`` sets (an infer_judge job: the infer's and the judge's)."""
        return self.model_copy(update={k: getattr(other, k) for k in other.model_fields_set})


_WIRE = JobParams()


@dataclass(frozen=True)
class JobSetup:
    """What a worker makes of a job's params (:func:`parse_params`): its prompts, judge and policies."""

    chunk_size: int = _WIRE.chunk_size
    id_field: str = _WIRE.id_field
    round: int = _WIRE.round
    input_records: int | None = None
    # what an infer job does with its records (engines.pooling): generate, or a pooling task
    task: str = _WIRE.task
    prompts: PromptBuilder | None = None
    judge: Judge | None = None
    output_format: str = _WIRE.output_format
    max_attempts: int = _WIRE.max_attempts
    # verdicts scored below this (or unscored) go to people: rejected, marked for_review
    review_below: float | None = None
    checkpoint_every: int = _WIRE.checkpoint_every
    checkpoint_interval_s: float = _WIRE.checkpoint_interval_s
    # which of a record's candidates (sampling n > 1) reach results (judges.candidates)
    select: str = DEFAULT_SELECT
    # what the judge step and retries do with completions cut at max_tokens
    truncation: TruncationPolicy = field(default_factory=TruncationPolicy)
    # the run's LoRA adapters by name (a record's adapter field picks one)
    adapters: Mapping[str, Adapter] = field(default_factory=dict)
    # approved rows held back for people to check, at the round's rate (judges.spot_check)
    spot_check: SpotCheck | None = None
    # an infer job's jury whose llm members it judges where it generates (params jury_at_inference)
    early_jury: Jury | None = None
    # a judge job's record prompts (the run's prompt_template, system and retry_template, retry_system):
    # the conversation a model judge scores
    conversation: PromptBuilder | None = None
    raw: Mapping[str, Any] = field(default_factory=dict)


def _int(params: Mapping[str, Any], key: str, default: int, minimum: int) -> int:
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"params.{key} must be an integer >= {minimum}, got {value!r}")
    return value


def _sampling(values: Any) -> SamplingParams:
    """``params.sampling``: refused when a field is unknown, not of its schema or honoured by no engine."""
    if values is not None and not isinstance(values, Mapping):
        raise ConfigError(f"params.sampling must be an object of sampling fields, got {values!r}")
    refused = refusals(values or {}, in_body=False)
    if refused:
        raise ConfigError("; ".join(refused))
    return SamplingParams.from_mapping(values)


def _task(kind: str, params: Mapping[str, Any]) -> str:
    """``params.task``: a pooling task computes each record once (its rows are retried in rounds,
    not in place), and generates nothing a sampling setting could change."""
    task = check_task(params.get("task", _WIRE.task), "params.task")
    if task == GENERATE:
        return task
    if kind == "in_place":
        raise ConfigError(f"params.task {task!r}: an in_place job generates; a {task} run retries in rounds")
    generating = [
        k for k in ("sampling", "system", "retry_template", "retry_system", "retry_sampling") if params.get(k)
    ]
    if generating:
        raise ConfigError(
            f"params.{generating[0]}: task {task} reads each record's text once and generates nothing, "
            f"so it does not apply: remove {', '.join(generating)} (or set task generate)"
        )
    return task


def _early_jury(spec: Any, callables: CallablePolicy | None, engine: str | None) -> Jury:
    """``params.jury_at_inference``: a jury whose llm members an infer job judges as it generates."""
    jury = build_judge(spec, callables=callables, engine=engine)
    if not isinstance(jury, Jury) or not jury.early:
        raise ConfigError(
            "params.jury_at_inference must be a jury with a model judge (reward, classifier) and llm "
            "members, which the infer job judges where it generates; got "
            f"{spec.get('type') if isinstance(spec, Mapping) else spec!r}"
        )
    return jury


def parse_params(
    kind: str,
    params: Mapping[str, Any],
    *,
    callables: CallablePolicy | None = None,
    engine: str | None = None,
) -> JobSetup:
    """Validate ``params`` for a job of ``kind`` (``infer``, ``judge``, ``infer_judge``, ``in_place``).

    :param callables: the ``callable`` judge targets that may be imported (checked before any import);
        ``None``, the default, allows every target: workers pass their own policy
        (``WorkerConfig.callable_policy()``, none allowed unless ``--allow-callable``).
    :param engine: the engine that runs the job (a worker's): a field of ``params.sampling`` it does
        not honour makes each record an error row naming it. ``params.sampling`` fields that no engine
        honours, or not of their schemas, are refused whatever the engine. An ``llm`` judge asks it
        for its verdict as a JSON schema where it honours structured outputs.
    """
    common: dict[str, Any] = {
        "chunk_size": _int(params, "chunk_size", _WIRE.chunk_size, 1),
        "id_field": str(params.get("id_field", _WIRE.id_field)),
        "round": _int(params, "round", _WIRE.round, 0),
        "input_records": params.get("input_records"),
        "raw": dict(params),
        "truncation": TruncationPolicy.from_params(params),
    }
    if kind in ("infer", "infer_judge", "in_place"):
        common["task"] = _task(kind, params)
        template = params.get("prompt_template")
        if template is not None and not isinstance(template, str):
            raise ConfigError("params.prompt_template must be a string (a Jinja2 template)")
        common["adapters"] = adapters = parse_adapters(params.get("adapters"), "params.adapters")
        _check_fan_out(params.get("input_range"), adapters)
        sampling = _sampling(params.get("sampling"))
        try:
            retry = RetrySettings.from_params(params, sampling)
        except ConfigError as exc:
            raise ConfigError(f"params.{exc}") from None
        common["prompts"] = PromptBuilder(
            template,
            system=params.get("system"),
            chat=bool(params.get("chat", _WIRE.chat)),
            sampling=sampling,
            engine=engine,
            adapters=adapters,
            retry=retry,
            max_tokens_cap=common["truncation"].max_tokens_cap,
        )
    if kind == "infer" and params.get("jury_at_inference") is not None:
        common["early_jury"] = _early_jury(params["jury_at_inference"], callables, engine)
    if kind in ("judge", "infer_judge", "in_place"):
        if "judge" not in params:
            raise ConfigError(f"a {kind} job needs params.judge (e.g. {{'type': 'llm'}})")
        common["judge"] = build_judge(params["judge"], callables=callables, engine=engine)
        if kind == "in_place":
            require_judge_in_place(common["judge"].kind, what="an in_place job")
        if "score" in judge_needs(params["judge"]):  # a model judge scores the record's conversation
            template = params.get("prompt_template")
            if template is not None and not isinstance(template, str):
                raise ConfigError("params.prompt_template must be a string (a Jinja2 template)")
            # a retried row's prompt: rendered as the infer job rendered it (the retry template, previous)
            texts = {k: params.get(k) for k in ("retry_template", "retry_system")}
            try:
                retry = RetrySettings.from_params(texts)
            except ConfigError as exc:
                raise ConfigError(f"params.{exc}") from None
            common["conversation"] = PromptBuilder(
                template, system=params.get("system"), chat=bool(params.get("chat", _WIRE.chat)), retry=retry
            )
        below = params.get("review_below_score")
        if below is not None and (
            isinstance(below, bool) or not isinstance(below, int | float) or not 0 <= below <= 1
        ):
            raise ConfigError(f"params.review_below_score must be a number in [0, 1], got {below!r}")
        common["review_below"] = None if below is None else float(below)
        common["select"] = check_select(params.get("select", _WIRE.select))
        if "spot_check" in params:
            if kind == "in_place" or isinstance(common["judge"], HumanJudge):
                what = (
                    "an in_place job" if kind == "in_place" else "a human judge, whose rows all go to people"
                )
                raise ConfigError(
                    "params.spot_check holds back approved rows of a rounds judge job for people: "
                    f"not of {what}"
                )
            common["spot_check"] = SpotCheck.from_params(params["spot_check"])
    if kind == "infer":
        fmt = params.get("output_format", _WIRE.output_format)
        if fmt not in ("rows", "openai"):
            raise ConfigError(f"params.output_format must be 'rows' or 'openai', got {fmt!r}")
        common["output_format"] = fmt
    if kind == "in_place":
        common["max_attempts"] = _int(params, "max_attempts", _WIRE.max_attempts, 1)
        common["checkpoint_every"] = _int(params, "checkpoint_every", _WIRE.checkpoint_every, 1)
        interval = params.get("checkpoint_interval_s", _WIRE.checkpoint_interval_s)
        if not isinstance(interval, int | float) or interval <= 0:
            raise ConfigError(f"params.checkpoint_interval_s must be > 0, got {interval!r}")
        common["checkpoint_interval_s"] = float(interval)
    return JobSetup(**common)


def _check_fan_out(input_range: Any, adapters: Mapping[str, Adapter]) -> None:
    """A round-0 range read once per arm (``input_range.fan_out``) names only the job's adapters (and
    the base model): checked at submit, not as every row's error."""
    if input_range is None:
        return
    fan_out = InputRange.from_params(input_range).fanned
    missing = [a for a in fan_out.adapters if a not in adapters] if fan_out is not None else []
    if missing:
        raise ConfigError(
            f"params.input_range.fan_out names {', '.join(missing)}, which params.adapters does not "
            f"({', '.join(sorted(adapters)) or 'none'}): give the job the run's adapters"
        )
