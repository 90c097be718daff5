"""One run's settings: what ``batchinfer run`` takes and what a DAG run's params become, and the
settings a round runs when reviews changed some of them (:data:`ROUND_SETTINGS`,
:func:`round_config`).

Stored as ``<run root>/run.json`` by the first task of a DAG run, so every later task (and a resumed
run) reads the same settings from storage instead of carrying them through XCom. The run's documents
(:mod:`~airflow_batchinfer.state.docs`, which the worker imports) import this module: it loads the
orchestration's settings table only when a run's settings are built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_batchinfer.engines.adapters import parse_adapters
from airflow_batchinfer.engines.base import SamplingParams
from airflow_batchinfer.engines.sampling import FIELDS, SAMPLING_FIELDS, completion_tokens, refusals
from airflow_batchinfer.exceptions import ConfigError, check_known_fields
from airflow_batchinfer.judges import UNIT_SCORES, judge_needs, judged_early
from airflow_batchinfer.judges.candidates import DEFAULT_SELECT, check_select
from airflow_batchinfer.judges.human import require_judge_in_place
from airflow_batchinfer.judges.truncation import DEFAULT_FACTOR, TruncationPolicy
from airflow_batchinfer.prompts.retries import RetrySettings
from airflow_batchinfer.state.timeouts import (
    UNREACHABLE_GRACE_MAX_S,
    UNREACHABLE_GRACE_MIN_S,
    UNREACHABLE_GRACE_S,
)
from airflow_batchinfer.storage.fan_out import FanOut
from airflow_batchinfer.storage.lines import MAX_LINE_BYTES, MIN_LINE_BYTES
from airflow_batchinfer.storage.records import MAX_ID_BYTES, MIN_ID_BYTES

# The choices of the ``strategy`` and ``review`` settings.
STRATEGIES = ("rounds", "in_place", "hybrid")
REVIEW_MODES = ("never", "every_round", "on_low_approval")


@dataclass
class RunConfig:
    input: str
    run_root: str
    prompt_template: str | None
    judge: dict[str, Any]
    system: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    # with sampling n > 1: which judged candidates of a record reach results (judges.candidates)
    select: str = DEFAULT_SELECT
    # LoRA adapters by name, each a directory on the workers: a record's adapter field picks one
    adapters: dict[str, str] = field(default_factory=dict)
    # round 0 runs every input record once per adapter (and the base model): ids ID@ADAPTER
    fan_out: str = "off"
    strategy: str = "rounds"
    max_rounds: int = 3
    max_attempts: int = 3
    # completions cut at max_tokens (judges.truncation): rejected before the judge or judged, and
    # their retries' max_tokens raised by the factor, up to the cap (a DAG run's: max_max_tokens)
    truncated: str = "reject"
    truncated_max_tokens_factor: float = DEFAULT_FACTOR
    max_tokens_cap: int | None = None
    # retries that use feedback (retries): the template and system message of a sample's second and
    # later attempts (which may read `previous`), and sampling fields per attempt over `sampling`
    retry_template: str | None = None
    retry_system: str | None = None
    retry_sampling: dict[str, Any] = field(default_factory=dict)
    records_per_shard: int = 2_000
    # shard jobs a round runs at once (run.lanes); 0: one lane per pool slot
    lanes: int = 0
    chunk_size: int = 500
    id_field: str | None = None
    assign_ids: bool = False
    # input bounds: the storage layer's defaults (settings.py holds their minimums)
    max_line_bytes: int = MAX_LINE_BYTES
    max_id_bytes: int = MAX_ID_BYTES
    # hybrid: switch to in place once a round approves less than this share of its pending set
    hybrid_min_shrink: float = 0.3
    job_retries: int = 2
    # a silent worker that may run a job: waited for this long before a second copy may start
    unreachable_grace_s: float = UNREACHABLE_GRACE_S
    # human review between rounds (Airflow only): never | every_round | on_low_approval
    review: str = "never"
    review_min_approval: float = 0.5
    # an llm judge's verdicts scored below this (or without a score) go to people, not through
    review_below_score: float | None = None
    # about this many of each round's judge-approved rows held back for people to check (0: none);
    # their verdicts and the reviewers' give the judge's calibration (judges.spot_check)
    spot_check_approved: int = 0
    # quarantined shards the run tolerates before its final state is failed
    max_failed_shards: int = 0
    # pre-flight sample (Airflow only): records to try first (0: off), and the GPU-hour budget
    preflight_records: int = 200
    budget_gpu_hours: float | None = None
    # the judge's own warm pool (a pool reference; e.g. a larger model judging a small generator):
    # each round then infers on the run's pool and judges there, shard by shard. None: every shard
    # is inferred and judged in one job on the run's pool.
    judge_pool: str | None = None

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"strategy {self.strategy!r}: choose one of {', '.join(STRATEGIES)}")
        if self.review not in REVIEW_MODES:
            raise ConfigError(f"review {self.review!r}: choose one of {', '.join(REVIEW_MODES)}")
        if self.max_rounds < 1 or self.max_attempts < 1:
            raise ConfigError("max_rounds and max_attempts must be >= 1")
        if self.records_per_shard < 1:
            raise ConfigError(f"records_per_shard must be >= 1, got {self.records_per_shard}")
        if self.lanes < 0:
            raise ConfigError(f"lanes must be >= 0 (0: one lane per pool slot), got {self.lanes}")
        check_select(self.select)
        parse_adapters(self.adapters)
        self.fan_out_arms()  # refuses a bad value, or a fan-out without adapters
        self._check_bounds()
        self._check_unreachable_grace()
        self.truncation()  # refuses a bad value, naming it
        self._check_retries()
        if not isinstance(self.judge, dict) or "type" not in self.judge:
            raise ConfigError('judge must be a judge spec such as {"type": "expected_answer", ...}')
        judge_type = self.judge.get("type")
        if self.strategy != "rounds":
            require_judge_in_place(judge_type, what=f"strategy {self.strategy!r} retries in place")
        if self.review_below_score is not None and judge_type not in UNIT_SCORES:
            raise ConfigError(
                "review_below_score routes verdicts scored below it to people, and the "
                f"{judge_type!r} judge gives no scores in [0, 1]. Remove it, or use a judge that does "
                f"({', '.join(UNIT_SCORES)})"
            )
        self._check_spot_check(judge_type)
        if self.judge_pool == "":
            self.judge_pool = None  # an empty value: no pool of its own
        self._check_judge_models()

    def _check_judge_models(self) -> None:
        """The judge's models and its pools: a judge pool serves a judge that asks for a model; a
        model judge (reward, classifier) needs one, in rounds; llm and model judges together only
        as members of a jury (judges.jury says where each runs)."""
        needs, kind = judge_needs(self.judge), self.judge.get("type")
        if self.judge_pool is not None and not needs:
            raise ConfigError(
                f"judge_pool {self.judge_pool!r} serves a judge model, but the judge is {kind!r}, which "
                "needs none: remove judge_pool, or use a judge that asks a model (llm, classifier, reward)"
            )
        if "score" not in needs:
            return
        if self.judge_pool is None:
            raise ConfigError(
                "a reward or classifier judge scores with a sequence-classification or reward model, which "
                "the judge's own pool serves: give judge_pool (a DAG built with judge_airflow_pool=, its "
                "judge_model the scoring model; batchinfer run --judge-pool local://NAME, a pool started "
                "with `batchinfer pool up --name NAME --model DIR`)"
            )
        if self.strategy != "rounds":
            raise ConfigError(
                f"a reward or classifier judge scores on the judge pool, and strategy {self.strategy!r} "
                "judges retries in place on the run's pool: use strategy rounds"
            )
        if needs == {"generate", "score"} and kind != "jury":
            raise ConfigError(
                f"the {kind!r} judge asks for both a generating model (llm) and a scoring model (reward, "
                "classifier), which no one pool serves: make them members of a jury, where llm members "
                "are judged on the run's pool as the answers are generated"
            )

    def _check_spot_check(self, judge_type: Any) -> None:
        """Spot checks need a judge that approves, and rounds (the gate between them)."""
        n = self.spot_check_approved
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(f"spot_check_approved must be an integer >= 0 (0: none), got {n!r}")
        if not n:
            return
        if judge_type == "human":
            raise ConfigError(
                "spot_check_approved puts some of the judge's approved rows before people, but a human "
                "judge approves none on its own (every row goes to people): remove spot_check_approved"
            )
        if self.strategy == "in_place":
            raise ConfigError(
                "spot_check_approved holds back approved rows of a round until its review gate; strategy "
                "'in_place' has no rounds: use strategy 'rounds' or 'hybrid', or remove spot_check_approved"
            )

    def _check_bounds(self) -> None:
        """``max_line_bytes`` and ``max_id_bytes`` at least their settings' minimums."""
        for name, least, default in (
            ("max_line_bytes", MIN_LINE_BYTES, MAX_LINE_BYTES),
            ("max_id_bytes", MIN_ID_BYTES, MAX_ID_BYTES),
        ):
            if getattr(self, name) < least:
                raise ConfigError(
                    f"{name} must be >= {least:g}, got {getattr(self, name)}: raise it (its default is "
                    f"{default})"
                )

    def _check_retries(self) -> None:
        """The retry settings, checked over the run's ``sampling`` (:meth:`retry`), and no retry
        asking for more ``max_tokens`` than ``max_tokens_cap`` (which bounds every retry's)."""
        retry = self.retry()
        cap = self.max_tokens_cap
        for first, fields in retry.sampling if cap is not None else ():
            tokens = completion_tokens(fields)
            if tokens is not None and tokens > cap:
                raise ConfigError(
                    f"retry_sampling.{first}.max_tokens {tokens} is above max_tokens_cap {cap} (a DAG run's: "
                    "the deployment's max_max_tokens): lower it, or ask for a higher cap"
                )

    def retry(self) -> RetrySettings:
        """The retry settings (:mod:`~airflow_batchinfer.prompts.retries`), checked: a bad one is refused,
        naming it (their entries over the run's sampling: :meth:`validate`)."""
        try:
            base = SamplingParams.from_mapping(self.sampling)
        except ConfigError:
            base = None  # the run's sampling is refused on its own, with its reason
        return RetrySettings.from_params(
            {"retry_template": self.retry_template, "retry_system": self.retry_system,
             "retry_sampling": self.retry_sampling},
            base,
        )  # fmt: skip

    def _check_unreachable_grace(self) -> None:
        """Below the minimum a worker is taken for gone after one silent ask (0: the protection off);
        above the maximum the grace never elapses within one try (each starts a fresh client)."""
        grace, low, high = self.unreachable_grace_s, UNREACHABLE_GRACE_MIN_S, UNREACHABLE_GRACE_MAX_S
        if not low <= grace <= high:
            raise ConfigError(
                f"unreachable_grace_s {grace:g} is outside {low:g}..{high:g} s: set it within (default "
                f"{UNREACHABLE_GRACE_S:g}); a shorter grace would start a second copy of a job a paused "
                "worker still runs, a longer one never elapses within a try, so no try could start the job"
            )

    def validate(self, callables: tuple[str, ...] | None = None) -> RunConfig:
        """Check templates, judge and sampling as the workers will, so a bad setting fails the first
        task with its reason instead of every shard job. ``callables``: the callable judge targets
        allowed (checked before anything is imported); ``None``: any (the caller vouches)."""
        from airflow_batchinfer.judges import CallablePolicy
        from airflow_batchinfer.state.params import parse_params

        policy = None if callables is None else CallablePolicy(callables)
        parse_params("infer", self.infer_params(), callables=policy)
        parse_params("judge", self.judge_params(), callables=policy)
        return self

    def engine_refusal(self, engine: str) -> str | None:
        """Why a pool running ``engine`` cannot run this run's ``sampling`` (each field it does not
        honour, named with the engines that do); ``None``: it can. :meth:`validate` refuses what no
        engine honours; this is for when the pool's engine is known (the pre-flight, a round's plan)."""
        refused = refusals(self.sampling, engine, in_body=False)
        logprob_judge = self.judge_pool is None and self.judge.get("score") == "logprob"  # judged there too
        if logprob_judge and not FIELDS["logprobs"].honoured_by(engine):
            refused.append(
                f"the llm judge's score logprob reads log probabilities, which the {engine} engine "
                f"does not give: use an engine that does ({', '.join(FIELDS['logprobs'].engines)}), "
                "or remove score"
            )
        for first, fields in self.retry().sampling:
            refused += [f"retry_sampling.{first}: {r}" for r in refusals(fields, engine, in_body=False)]
        from airflow_batchinfer.engines import adapter_engines  # the engine classes: only here

        if self.adapters and engine not in (loading := adapter_engines()):
            refused.append(
                f"adapters are LoRA adapters, which the {engine} engine does not load: use an engine "
                f"that does ({', '.join(loading)}), or remove adapters"
            )
        return "; ".join(refused) if refused else None

    def fan_out_arms(self) -> FanOut | None:
        """Round 0's fan-out over the run's adapters (``None``: off); sharding and every reader of
        round 0's input apply it (:mod:`~airflow_batchinfer.storage.fan_out`)."""
        return FanOut.of_mode(self.fan_out, self.adapters)

    def pools_refusal(
        self, engine: Mapping[str, Any] | None, judge_engine: Mapping[str, Any] | None = None
    ) -> str | None:
        """Why the pools cannot serve this run (their engines' descriptions, ``None``: not known; a
        scoring model's says ``task: score``): the run's pool generates; the judge pool scores for a
        model judge, and generates for llm judges judged there. ``None``: they can."""

        def scores(described: Mapping[str, Any]) -> bool:
            return described.get("task") == "score"

        needs = judge_needs(self.judge)
        if engine is not None and scores(engine):
            return (
                f"the run's pool serves a scoring model ({engine.get('model')}), which generates nothing: "
                "give worker_pool a generating model, and the scoring model to the judge pool"
            )
        if judge_engine is None or self.judge_pool is None:
            return None
        if "score" in needs and not scores(judge_engine):
            return (
                f"the judge is {self.judge.get('type')!r}, which scores with a sequence-classification or "
                f"reward model, and the judge pool's model ({judge_engine.get('model')}) generates: give the "
                "judge pool the scoring model (judge_model; `batchinfer pool up --model`)"
            )
        if "score" not in needs and scores(judge_engine):
            return (
                f"the judge pool serves a scoring model ({judge_engine.get('model')}), and the "
                f"{self.judge.get('type')!r} judge asks a generating one: give the judge pool a generating "
                "model, or use a reward or classifier judge"
            )
        return None

    def truncation(self) -> TruncationPolicy:
        return TruncationPolicy(self.truncated, self.truncated_max_tokens_factor, self.max_tokens_cap)

    def infer_params(self) -> dict[str, Any]:
        return {
            "prompt_template": self.prompt_template,
            "system": self.system,
            "sampling": self.sampling,
            "chunk_size": self.chunk_size,
            "id_field": self.id_field or "id",
            **self.truncation().params(),  # none at the defaults: job ids and fingerprints as before
            **({"adapters": self.adapters} if self.adapters else {}),
            # a jury's llm members beside a model judge: judged where the answers are generated
            **({"jury_at_inference": self.judge} if judged_early(self.judge) else {}),
            **self.retry().params(),  # only those set: job ids and fingerprints as before
        }

    def judge_params(self) -> dict[str, Any]:
        review = {} if self.review_below_score is None else {"review_below_score": self.review_below_score}
        return {
            "judge": self.judge,
            "chunk_size": self.chunk_size,
            "id_field": self.id_field or "id",
            **review,
            **self._select(),
            **self.truncation().params(),
            **self._conversation(),
        }

    def _conversation(self) -> dict[str, Any]:
        """What a model judge scores an answer with: the record's prompt as this run renders it, a
        retry's with the retry template and system message (none for other judges: their job ids and
        fingerprints as before; the retry settings only when set)."""
        if "score" not in judge_needs(self.judge):
            return {}
        return {
            "prompt_template": self.prompt_template,
            "system": self.system,
            **self.retry().texts().params(),
        }

    def _select(self) -> dict[str, Any]:
        """``select`` as a job's param: none at the default (job ids and fingerprints as before)."""
        return {} if self.select == DEFAULT_SELECT else {"select": self.select}

    @property
    def human_review(self) -> bool:
        """Whether people judge some of every round's samples: a human judge, low-scored verdicts, or
        spot checks of the approved ones."""
        return (
            self.judge.get("type") == "human"
            or self.review_below_score is not None
            or bool(self.spot_check_approved)
        )

    def in_place_params(self) -> dict[str, Any]:
        return {
            **self.infer_params(),
            "judge": self.judge,
            "max_attempts": self.max_attempts,
            **self._select(),
        }

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        check_known_fields(cls, data, "run settings")
        return cls(**data)


# What a review may change for the next rounds (run.gate.changes: the gate's form and its checks), over
# run.json's: a sampling field (engines.sampling holds its bounds) goes in ``RunConfig.sampling``,
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
    sampling = dict(cfg.sampling)
    other: dict[str, Any] = {}
    for key, value in settings.items():
        if key in ROUND_SETTINGS:
            if key in SAMPLING_FIELDS:
                sampling[key] = value
            else:
                other[key] = value
    return dataclasses.replace(cfg, sampling=sampling, **other).validate()
