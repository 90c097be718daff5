"""One run's settings: what ``batchinfer run`` takes and what a DAG run's params become, and the
settings a round runs when reviews changed some of them (:data:`ROUND_SETTINGS`,
:func:`round_config`).

Stored as ``<run root>/run.json`` by the first task of a DAG run, so every later task (and a resumed
run) reads the same settings from storage instead of carrying them through XCom; flat, as params and
flags name them, while ``RunConfig`` holds them by section (:mod:`~airflow_batchinfer.state.config_sections`,
each setting's default and description declared once there). The run's documents
(:mod:`~airflow_batchinfer.state.docs`, which the worker imports) import this module: it loads the
orchestration's settings table only when a run's settings are built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, get_type_hints

from pydantic import ValidationError

from airflow_batchinfer.engines.base import SamplingParams
from airflow_batchinfer.engines.pooling import served_refusal
from airflow_batchinfer.engines.sampling import FIELDS, SAMPLING_FIELDS, refusals
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges import UNIT_SCORES, judge_needs, judged_early
from airflow_batchinfer.judges.human import require_judge_in_place
from airflow_batchinfer.prompts.retries import RetrySettings
from airflow_batchinfer.state.config_checks import (
    check_judge_models,
    check_retries,
    check_spot_check,
    check_task,
)
from airflow_batchinfer.state.config_sections import (
    BudgetConfig,
    DataConfig,
    JudgeConfig,
    PromptConfig,
    RetryConfig,
    ReviewConfig,
    ShardingConfig,
)
from airflow_batchinfer.state.params import JobParams, parse_params


@dataclass(frozen=True)
class RunConfig:
    """A run's settings: its root and one of each section (:mod:`~airflow_batchinfer.state.config_sections`,
    where each default is declared once, with its description). A setting keeps its flat name (a
    section's field) in DAG params, flags and ``run.json``: :meth:`of` makes one from flat settings,
    :meth:`to_dict` gives them back. Frozen: a changed setting is a new ``RunConfig``
    (:meth:`replace`), checked as it is made; the checks that span sections are here."""

    run_root: str  # from output_root and run_name: not a setting of its own
    data: DataConfig
    prompt: PromptConfig
    judging: JudgeConfig
    retries: RetryConfig = field(default_factory=RetryConfig)
    reviews: ReviewConfig = field(default_factory=ReviewConfig)
    sharding: ShardingConfig = field(default_factory=ShardingConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)

    def __post_init__(self) -> None:
        check_retries(self)
        judge_type = self.judging.judge.get("type")
        if self.retries.strategy != "rounds":
            require_judge_in_place(judge_type, what=f"strategy {self.retries.strategy!r} retries in place")
        if self.reviews.review_below_score is not None and judge_type not in UNIT_SCORES:
            raise ConfigError(
                "review_below_score routes verdicts scored below it to people, and the "
                f"{judge_type!r} judge gives no scores in [0, 1]. Remove it, or use a judge that does "
                f"({', '.join(UNIT_SCORES)})"
            )
        check_spot_check(self, judge_type)
        check_judge_models(self)
        check_task(self)

    @classmethod
    def of(cls, **flat: Any) -> RunConfig:
        """A ``RunConfig`` from flat settings (``run_root`` and the sections' fields by name, as
        ``run.json``, DAG params and flags have them); an unknown name is refused."""
        grouped = _by_section(flat)
        if "run_root" not in flat:
            raise ConfigError("run settings without run_root")
        return cls(
            flat["run_root"], **{name: kind(**grouped.get(name, {})) for name, kind in _SECTIONS.items()}
        )

    def replace(self, **flat: Any) -> RunConfig:
        """This config with the flat settings ``flat`` changed (each in its section), checked anew."""
        sections = {
            name: dataclasses.replace(getattr(self, name), **c) for name, c in _by_section(flat).items()
        }
        return dataclasses.replace(self, run_root=flat.get("run_root", self.run_root), **sections)

    def setting(self, name: str) -> Any:
        """The value of the setting ``name`` (its flat name), for callers that hold setting names as
        data (a gate's changes); code that names a setting reads it on its section."""
        return getattr(getattr(self, _SECTION_OF[name]), name)

    @staticmethod
    def setting_fields() -> dict[str, dataclasses.Field[Any]]:
        """Every run setting's field (its default and description), by its flat name."""
        return {f.name: f for kind in _SECTIONS.values() for f in dataclasses.fields(kind)}

    def retry(self) -> RetrySettings:
        """The retry settings (:mod:`~airflow_batchinfer.prompts.retries`), checked: a bad one is refused,
        naming it (their entries over the run's sampling: :meth:`validate`)."""
        try:
            base = SamplingParams.from_mapping(self.prompt.sampling)
        except ConfigError:
            base = None  # the run's sampling is refused on its own, with its reason
        return RetrySettings.from_params(
            {"retry_template": self.retries.retry_template, "retry_system": self.retries.retry_system,
             "retry_sampling": self.retries.retry_sampling},
            base,
        )  # fmt: skip

    def validate(self, callables: tuple[str, ...] | None = None) -> RunConfig:
        """Check templates, judge and sampling as the workers will, so a bad setting fails the first
        task with its reason instead of every shard job. ``callables``: the callable judge targets
        allowed (checked before anything is imported); ``None``: any (the caller vouches)."""
        from airflow_batchinfer.judges import CallablePolicy

        policy = None if callables is None else CallablePolicy(callables)
        parse_params("infer", self.infer_params().wire(), callables=policy)
        parse_params("judge", self.judge_params().wire(), callables=policy)
        return self

    def engine_refusal(self, engine: str) -> str | None:
        """Why a pool running ``engine`` cannot run this run's ``sampling`` (each field it does not
        honour, named with the engines that do); ``None``: it can. :meth:`validate` refuses what no
        engine honours; this is for when the pool's engine is known (the pre-flight, a round's plan)."""
        refused = refusals(self.prompt.sampling, engine, in_body=False)
        judging = self.judging  # an llm judge judged on the run's pool, scoring with logprobs:
        logprob_judge = judging.judge_pool is None and judging.judge.get("score") == "logprob"
        if logprob_judge and not FIELDS["logprobs"].honoured_by(engine):
            refused.append(
                f"the llm judge's score logprob reads log probabilities, which the {engine} engine "
                f"does not give: use an engine that does ({', '.join(FIELDS['logprobs'].engines)}), "
                "or remove score"
            )
        for first, fields in self.retry().sampling:
            refused += [f"retry_sampling.{first}: {r}" for r in refusals(fields, engine, in_body=False)]
        from airflow_batchinfer.engines import adapter_engines  # the engine classes: only here

        if self.prompt.adapters and engine not in (loading := adapter_engines()):
            refused.append(
                f"adapters are LoRA adapters, which the {engine} engine does not load: use an engine "
                f"that does ({', '.join(loading)}), or remove adapters"
            )
        return "; ".join(refused) if refused else None

    def pools_refusal(
        self, engine: Mapping[str, Any] | None, judge_engine: Mapping[str, Any] | None = None
    ) -> str | None:
        """Why the pools cannot serve this run (their engines' descriptions, ``None``: not known; a
        scoring model's says ``task: score``): the run's pool generates; the judge pool scores for a
        model judge, and generates for llm judges judged there. ``None``: they can."""

        def scores(described: Mapping[str, Any]) -> bool:
            return described.get("task") == "score"

        judge, judge_pool = self.judging.judge, self.judging.judge_pool
        needs = judge_needs(judge)
        if engine is not None and (why := served_refusal(self.prompt.task, engine)) is not None:
            return why
        if judge_engine is None or judge_pool is None:
            return None
        if "score" in needs and not scores(judge_engine):
            return (
                f"the judge is {judge.get('type')!r}, which scores with a sequence-classification or "
                f"reward model, and the judge pool's model ({judge_engine.get('model')}) generates: give the "
                "judge pool the scoring model (judge_model; `batchinfer pool up --model`)"
            )
        if "score" not in needs and scores(judge_engine):
            return (
                f"the judge pool serves a scoring model ({judge_engine.get('model')}), and the "
                f"{judge.get('type')!r} judge asks a generating one: give the judge pool a generating "
                "model, or use a reward or classifier judge"
            )
        return None

    def infer_params(self) -> JobParams:
        """An infer job's params (:class:`~airflow_batchinfer.state.params.JobParams`: on the wire, those
        at their defaults are left out)."""
        prompt, judge = self.prompt, self.judging.judge
        return _job_params(
            task=prompt.task,
            prompt_template=prompt.prompt_template,
            system=prompt.system,
            sampling=prompt.sampling,
            chunk_size=self.sharding.chunk_size,
            id_field=self.data.id_field or "id",
            **self._truncation(),
            adapters=prompt.adapters,
            # a jury's llm members beside a model judge: judged where the answers are generated
            jury_at_inference=judge if judged_early(judge) else None,
            **self.retry().params(),
        )

    def judge_params(self) -> JobParams:
        """A judge job's params (an infer_judge job's: :meth:`infer_params` merged with these)."""
        return _job_params(
            judge=self.judging.judge,
            chunk_size=self.sharding.chunk_size,
            id_field=self.data.id_field or "id",
            review_below_score=self.reviews.review_below_score,
            select=self.prompt.select,
            **self._truncation(),
            **self._conversation(),
        )

    def _truncation(self) -> dict[str, Any]:
        retries = self.retries
        return {
            "truncated": retries.truncated,
            "truncated_max_tokens_factor": retries.truncated_max_tokens_factor,
            "max_tokens_cap": retries.max_tokens_cap,
        }

    def _conversation(self) -> dict[str, Any]:
        """What a model judge scores an answer with: the record's prompt as this run renders it, a
        retry's with the retry template and system message (none for other judges)."""
        if "score" not in judge_needs(self.judging.judge):
            return {}
        return {
            "prompt_template": self.prompt.prompt_template,
            "system": self.prompt.system,
            **self.retry().texts().params(),
        }

    @property
    def human_review(self) -> bool:
        """Whether people judge some of every round's samples: a human judge, low-scored verdicts, or
        spot checks of the approved ones."""
        return (
            self.judging.judge.get("type") == "human"
            or self.reviews.review_below_score is not None
            or bool(self.reviews.spot_check_approved)
        )

    def in_place_params(self) -> JobParams:
        """An in_place job's params: the infer job's, the judge and its attempts."""
        return self.infer_params().merge(
            _job_params(
                judge=self.judging.judge, max_attempts=self.retries.max_attempts, select=self.prompt.select
            )
        )

    def to_dict(self) -> dict[str, Any]:
        """The flat settings (``run.json``'s): ``run_root`` and each section's fields by name."""
        out: dict[str, Any] = {"run_root": self.run_root}
        for name in _SECTIONS:
            out.update(dataclasses.asdict(getattr(self, name)))
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        return cls.of(**data)


# The sections, by their RunConfig field's name, and each setting's section (by its flat name): from
# the dataclasses, so a setting added to a section is a flat setting at once.
_HINTS = get_type_hints(RunConfig)
_SECTIONS: dict[str, type[Any]] = {
    f.name: _HINTS[f.name] for f in dataclasses.fields(RunConfig) if dataclasses.is_dataclass(_HINTS[f.name])
}
_SECTION_OF: dict[str, str] = {
    f.name: name for name, kind in _SECTIONS.items() for f in dataclasses.fields(kind)
}


def _by_section(flat: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Flat settings by the section that holds them (``run_root`` is none's); an unknown one is refused."""
    unknown = sorted(set(flat) - {"run_root", *_SECTION_OF})
    if unknown:
        raise ConfigError(f"unknown run settings {unknown}; known: {sorted({'run_root', *_SECTION_OF})}")
    out: dict[str, dict[str, Any]] = {}
    for name, value in flat.items():
        if name != "run_root":
            out.setdefault(_SECTION_OF[name], {})[name] = value
    return out


def _job_params(**params: Any) -> JobParams:
    """:class:`JobParams` of these run settings; a value not of its param's type is refused naming it
    (before the worker's checks, :meth:`RunConfig.validate`)."""
    try:
        return JobParams(**params)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(x) for x in error["loc"])
        raise ConfigError(f"params.{where}: {error['msg']}, got {error.get('input')!r}") from None


# What a review may change for the next rounds (run.gate.changes: the gate's form and its checks), over
# run.json's: a sampling field (engines.sampling holds its bounds) goes in ``PromptConfig.sampling``,
# the others are run settings of their own.
ROUND_SETTINGS = ("temperature", "max_tokens", "prompt_template", "system", "retry_template")


def round_config(cfg: RunConfig, settings: dict[str, Any] | None) -> RunConfig:
    """The settings a round runs: run.json's (``cfg``) with what reviews changed (``settings``, a
    plan's; keys not in :data:`ROUND_SETTINGS` are ignored), validated as the workers will (a bad
    template fails the gate's answer, not every job). Computed once, by the plan step
    (:mod:`~airflow_batchinfer.run.plan`), and carried in the plan (``Plan.config``). Job ids and
    fingerprints follow, so a changed round never reuses the old settings' outputs."""
    if not settings:
        return cfg
    sampling = dict(cfg.prompt.sampling)
    other: dict[str, Any] = {}
    for key, value in settings.items():
        if key in ROUND_SETTINGS:
            if key in SAMPLING_FIELDS:
                sampling[key] = value
            else:
                other[key] = value
    return cfg.replace(sampling=sampling, **other).validate()
