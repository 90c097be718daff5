"""The sections of a run's settings (:class:`~airflow_batchinfer.state.config.RunConfig` holds one of
each): each setting's default and description are declared once, on its section's field
(:func:`_about`), and each section checks its own fields as it is made (checks that span sections are
``RunConfig``'s). The sections group the settings as the trigger form's sections do; a setting's
name is its field's, the same flat name in DAG params, ``batchinfer run`` flags and ``run.json``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow_batchinfer.engines.adapters import NAME as ADAPTER_NAME
from airflow_batchinfer.engines.adapters import parse_adapters
from airflow_batchinfer.engines.pooling import GENERATE, TASKS
from airflow_batchinfer.engines.sampling import sampling_help, sampling_schemas
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges import JUDGE_TYPES
from airflow_batchinfer.judges.candidates import DEFAULT_SELECT, SELECTS, check_select
from airflow_batchinfer.judges.truncation import (
    DEFAULT_FACTOR,
    MAX_FACTOR,
    TRUNCATED_MODES,
    TruncationPolicy,
)
from airflow_batchinfer.prompts.retries import NOT_PER_ATTEMPT
from airflow_batchinfer.state.config_checks import check_bounds, check_unreachable_grace
from airflow_batchinfer.state.timeouts import (
    UNREACHABLE_GRACE_MAX_S,
    UNREACHABLE_GRACE_MIN_S,
    UNREACHABLE_GRACE_S,
)
from airflow_batchinfer.storage.fan_out import BASE as ADAPTER_BASE
from airflow_batchinfer.storage.fan_out import FAN_OUT_MODES, FanOut
from airflow_batchinfer.storage.lines import MAX_LINE_BYTES, MIN_LINE_BYTES
from airflow_batchinfer.storage.record_file import OUTPUT_FORMATS, output_suffix
from airflow_batchinfer.storage.records import MAX_ID_BYTES, MIN_ID_BYTES

# The choices of the ``strategy`` and ``review`` settings.
STRATEGIES = ("rounds", "in_place", "hybrid")
REVIEW_MODES = ("never", "every_round", "on_low_approval")
# The choices of ``gate_idle``: what a review gate does with the run's workers while it waits
# (run.gate.idle decides what each means for a pool).
GATE_IDLE = ("auto", "keep", "sleep", "release")
# The key of a run setting's description in its field's metadata (:func:`_about`).
SETTING = "setting"

# engines.sampling: the fields the sampling setting takes, with their bounds (others are refused)
SAMPLING_PROPERTIES: dict[str, Any] = sampling_schemas()
# retry_sampling: an attempt number >= 2 -> the sampling fields a retry may change
RETRY_ATTEMPT_PATTERN = "^([2-9]|[1-9][0-9]+)$"
RETRY_SAMPLING_PROPERTIES: dict[str, Any] = {
    k: v for k, v in SAMPLING_PROPERTIES.items() if k not in NOT_PER_ATTEMPT
}


def _about(help_: str, type_: str, **kw: Any) -> dict[str, Any]:
    """A run setting's description beside its default: its JSON-schema type, help, trigger-form
    section, flag and bounds (the keywords of :class:`~airflow_batchinfer.spec.settings.Setting`,
    which makes the DAG param, the ``batchinfer run`` flag and the docs' row from it)."""
    return {SETTING: {"help": help_, "type": type_, **kw}}


@dataclass(frozen=True)
class DataConfig:
    """Where the records come from, how they are identified and how long a line or an id may be.
    ``input`` has no default here: its ``default`` is the DAG param's and the flag's."""

    # fmt: off
    input: str = field(metadata=_about(
        "the dataset, read in place: one .jsonl(.zst) file, or a directory or glob of .jsonl, .jsonl.zst or "
        ".parquet part files (one format; names starting with _ or . skipped); a path, s3:// or fsspec URI",
        "string", default="/tmp/batchinfer/input.jsonl",
        min_length=1, flag="input", section="Data"))
    id_field: str | None = field(default=None, metadata=_about(
        "the records' unique id field; empty: detected (id, or custom_id in OpenAI batch input)", "string",
        nullable=True, min_length=1, flag="--id-field", metavar="FIELD"))
    assign_ids: bool = field(default=False, metadata=_about(
        "give records without an id the id '<file>:<line>'", "boolean", flag="--assign-ids"))
    # input bounds: the storage layer's defaults and minimums
    max_line_bytes: int = field(default=MAX_LINE_BYTES, metadata=_about(
        "the longest input line, in bytes: a longer one goes to rejects/ with its line number, its first KiB "
        "and its length, and is never held whole; a DAG run may raise it only up to the deployment's "
        "max_max_line_bytes (unset: this default)", "integer", minimum=MIN_LINE_BYTES,
        flag="--max-line-bytes"))
    max_id_bytes: int = field(default=MAX_ID_BYTES, metadata=_about(
        "the longest record id, in UTF-8 bytes of the id as text: a record with a longer one goes to "
        "rejects/; a DAG run may raise it only up to the deployment's max_max_id_bytes (unset: this "
        "default)", "integer", minimum=MIN_ID_BYTES, flag="--max-id-bytes"))
    # what results/, rejected/ and dropped/ hold (storage.parquet_schema: the Parquet files' schema)
    output_format: str = field(default="jsonl", metadata=_about(
        "the format of the rows in results/, rejected/ and dropped/: jsonl (.jsonl.zst files) or parquet "
        "(.parquet files of one schema: the input's fields as typed columns, pinned when the run is planned, "
        "then the generation's; readable as one dataset by pyarrow, DuckDB or pandas, and the rows "
        "left pending in pending/ too; needs pip install 'airflow-batchinfer[parquet]'); a run keeps the "
        "format it started with", "string", choices=OUTPUT_FORMATS,
        flag="--output-format"))
    # fmt: on

    def __post_init__(self) -> None:
        check_bounds(self)
        output_suffix(self.output_format)  # one of OUTPUT_FORMATS, or refused naming them


@dataclass(frozen=True)
class PromptConfig:
    """What each record is sent with: its prompt, system message and sampling, the adapters that
    answer it and which of its candidates reach results. ``prompt_template`` has no default here."""

    # fmt: off
    prompt_template: str | None = field(metadata=_about(
        "Jinja2 over record fields, e.g. 'What is {{ question }}?'; empty: the records are OpenAI batch "
        "requests (each body field is honoured by the engine or the record refused, naming the field: "
        "the docs' sampling table)", "string", default=None, nullable=True, min_length=1,
        flag="--prompt-template", metavar="TEMPLATE", section="Prompt & sampling"))
    # what is done with each record (engines.pooling): generated from, or embedded, classified, scored
    task: str = field(default=GENERATE, metadata=_about(
        "what the run does with each record: generate (the model's answer in result); embed (a vector: "
        "embedding, base64 of little-endian float32, with dimensions); classify (label, the likeliest, and "
        "probs, each label's probability); score (the raw outputs: score, or scores per label). The run's "
        "pool serves a model for it: an embedding model, or a sequence-classification or reward model. A "
        'classify run filters with the judge {"type": "label", "keep_labels": [...]}; an embed or score '
        'run keeps every row with {"type": "accept"}', "string", choices=TASKS, flag="--task"))
    system: str | None = field(default=None, metadata=_about(
        "system message for chat models; empty: none", "string", nullable=True, flag="--system",
        metavar="TEXT"))
    sampling: dict[str, Any] = field(default_factory=dict, metadata=_about(
        sampling_help(), "object",
        schema_extra={"properties": SAMPLING_PROPERTIES, "additionalProperties": False}, flag="--sampling",
        metavar="JSON", section="Prompt & sampling"))
    # with sampling n > 1: which judged candidates of a record reach results (judges.candidates)
    select: str = field(default=DEFAULT_SELECT, metadata=_about(
        "with sampling n > 1, which of a record's judged candidates reach results: first_approved, "
        "best_score (the approved one the judge scored highest) or all (every approved one, in the row's "
        "candidates)",
        "string", choices=SELECTS, flag="--select"))
    # LoRA adapters by name, each a directory on the workers: a record's adapter field picks one
    adapters: dict[str, str] = field(default_factory=dict, metadata=_about(
        'LoRA adapters by name, each a PEFT directory on the workers, e.g. {"sql": "/models/lora-sql"}: a '
        "record's adapter field (an OpenAI batch body's model) picks the one that answers it (base: the base "
        "model; fan_out: every record on each); the summary "
        "and the report give approval per adapter. vllm pools need the engine option enable_lora", "object",
        schema_extra={
            "propertyNames": {"pattern": f"^{ADAPTER_NAME.pattern}$", "not": {"const": ADAPTER_BASE}},
            "additionalProperties": {"type": "string", "pattern": "^(/|file:///)"},
        },
        flag="--adapters", metavar="JSON"))
    # round 0 runs every input record once per adapter (and the base model): ids ID@ADAPTER
    fan_out: str = field(default="off", metadata=_about(
        "adapters: run every input record once per adapter, as rows with id "
        "ID@ADAPTER, adapter the adapter's name and input_id the record's id; adapters_and_base: on the "
        "base model too (ID@base); off: a record's adapter field picks. With a fan-out a record that "
        "picks its own adapter is a bad line (rejects/)", "string", choices=FAN_OUT_MODES, flag="--fan-out"))
    # fmt: on

    def __post_init__(self) -> None:
        check_select(self.select)
        parse_adapters(self.adapters)
        self.fan_out_arms()  # refuses a bad value, or a fan-out without adapters

    def fan_out_arms(self) -> FanOut | None:
        """Round 0's fan-out over the run's adapters (``None``: off); sharding and every reader of
        round 0's input apply it (:mod:`~airflow_batchinfer.storage.fan_out`)."""
        return FanOut.of_mode(self.fan_out, self.adapters)


@dataclass(frozen=True)
class JudgeConfig:
    """The judge and its own pool. ``judge`` has no default here: its ``default`` is the DAG param's
    and the flag's."""

    # fmt: off
    judge: dict[str, Any] = field(metadata=_about(
        'the judge spec: {"type": "llm"} (the model judges its own answers), "expected_answer", "regex", '
        '"json_schema", "length", "callable", "all" or "any" with their fields; "classifier" or "reward": a '
        'scoring model on the judge pool; "jury": judges that vote; "human": people judge every '
        'sample on the review page between rounds; "label" (keep_labels): a classify task\'s filter; '
        '"accept": every row kept (an embed or score task)', "object", default={"type": "llm"},
        schema_extra={"required": ["type"], "properties": {"type": {"enum": list(JUDGE_TYPES)}}},
        flag="--judge", metavar="JSON", section="Judge"))
    # None: every shard is inferred and judged in one job on the run's pool. A DAG built with a judge
    # pool always judges there (param_default)
    judge_pool: str | None = field(default=None, metadata=_about(
        "the judge's own warm pool (as worker_pool): an llm judge judges there with that pool's model (a "
        "classifier or reward judge with its scoring model), each shard's judge starting when its "
        "inference ends", "string",
        min_length=1, judge_pool_param=True, param_default="local://batchinfer-judge",
        flag="--judge-pool", metavar="POOL", section="Judge",
        flag_help="(local://NAME or kubernetes://NAMESPACE/NAME, started with `pool up`). "
        "Default: each shard is inferred and judged in one job on the run's pool"))
    # fmt: on

    def __post_init__(self) -> None:
        if not isinstance(self.judge, dict) or "type" not in self.judge:
            raise ConfigError('judge must be a judge spec such as {"type": "expected_answer", ...}')
        if self.judge_pool == "":
            object.__setattr__(self, "judge_pool", None)  # an empty value: no pool of its own (frozen)


@dataclass(frozen=True)
class RetryConfig:
    """How rejected samples are retried: rounds or in place, how often, a truncated one's
    ``max_tokens``, and what second and later attempts are sent with."""

    # fmt: off
    strategy: str = field(default="rounds", metadata=_about(
        "rounds: re-run the rejected set round by round; in_place: retry each sample in its job; hybrid: "
        "rounds, then in place once they stop paying", "string", choices=STRATEGIES, flag="--strategy",
        section="Retries"))
    max_rounds: int = field(default=3, metadata=_about(
        "rounds at most (also capped by the DAG's round slots)", "integer", minimum=1, flag="--max-rounds",
        section="Retries"))
    max_attempts: int = field(default=3, metadata=_about(
        "attempts per sample, in place", "integer", minimum=1, flag="--max-attempts"))
    # completions cut at max_tokens (judges.truncation): rejected before the judge or judged, and
    # their retries' max_tokens raised by the factor, up to the cap (a DAG run's: max_max_tokens)
    truncated: str = field(default="reject", metadata=_about(
        "a completion cut at max_tokens (finish_reason length): reject: rejected before the judge, reason "
        "truncated (truncated_in_thinking: a reasoning model cut while still thinking), and retried like "
        "any rejected sample; judge: the judge decides", "string",
        choices=TRUNCATED_MODES, flag="--truncated"))
    truncated_max_tokens_factor: float = field(default=DEFAULT_FACTOR, metadata=_about(
        "a truncated sample's retry (the next round, or in place) runs with max_tokens times this, never "
        "above max_tokens_cap (cut while thinking: its thinking_token_budget too, at most that max_tokens); "
        "1: not raised", "number", minimum=1, maximum=MAX_FACTOR,
        flag="--truncated-max-tokens-factor"))
    max_tokens_cap: int | None = field(default=None, metadata=_about(
        "the most max_tokens a truncated sample's retry is raised to: a DAG run's is the deployment's "
        "max_max_tokens (not a param); empty: no cap", "integer", nullable=True, minimum=1, param=False,
        flag="--max-tokens-cap", metavar="N"))
    # retries that use feedback (prompts.retries): what a sample's second and later attempts are sent with
    retry_template: str | None = field(default=None, metadata=_about(
        "the prompt template from a sample's second attempt on (the next round's, or in place), e.g. "
        "'{{ question }} Your last answer was {{ previous.result }}, rejected: {{ previous.reason }}'; "
        "previous is the last attempt's result, reason, score, attempt, note (a reviewer's), "
        "finish_reason and max_tokens (none on a first attempt); empty: prompt_template, which may read "
        "previous too", "string", nullable=True, min_length=1, flag="--retry-template", metavar="TEMPLATE"))
    retry_system: str | None = field(default=None, metadata=_about(
        "the system message from a sample's second attempt on; empty: system", "string", nullable=True,
        min_length=1, flag="--retry-system", metavar="TEXT"))
    retry_sampling: dict[str, Any] = field(default_factory=dict, metadata=_about(
        "sampling fields per attempt over sampling, by the attempt they start at (2, 3, …): attempt k "
        "runs with the entry of the highest attempt at most k, e.g. a temperature ramp "
        '{"2": {"temperature": 0.7}, "3": {"temperature": 1.0}}; n, logprobs and top_logprobs stay the '
        "run's", "object",
        schema_extra={
            "propertyNames": {"pattern": RETRY_ATTEMPT_PATTERN},
            "additionalProperties": {
                "type": "object", "properties": RETRY_SAMPLING_PROPERTIES, "additionalProperties": False,
            },
        },
        flag="--retry-sampling", metavar="JSON"))
    hybrid_min_shrink: float = field(default=0.3, metadata=_about(
        "hybrid: switch to in place once a round approves less than this share of its pending set", "number",
        minimum=0, maximum=1, flag="--hybrid-min-shrink"))
    # fmt: on

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"strategy {self.strategy!r}: choose one of {', '.join(STRATEGIES)}")
        if self.max_rounds < 1 or self.max_attempts < 1:
            raise ConfigError("max_rounds and max_attempts must be >= 1")
        self.truncation()  # refuses a bad value, naming it

    def truncation(self) -> TruncationPolicy:
        return TruncationPolicy(self.truncated, self.truncated_max_tokens_factor, self.max_tokens_cap)


@dataclass(frozen=True)
class ReviewConfig:
    """Human review between rounds (Airflow only): when, and which verdicts go to people."""

    # fmt: off
    review: str = field(default="never", metadata=_about(
        "human review between rounds, on Airflow's Required Actions page", "string", choices=REVIEW_MODES,
        section="Review"))
    review_min_approval: float = field(default=0.5, metadata=_about(
        "on_low_approval: review a round that approves less than this share", "number", minimum=0, maximum=1))
    review_below_score: float | None = field(default=None, metadata=_about(
        "verdicts scored below this (or without a score) go to people on the review page instead of passing "
        "on their own (an llm, classifier or jury judge's scores, in [0, 1]); empty: none", "number",
        nullable=True, minimum=0, maximum=1))
    # their verdicts and the reviewers' give the judge's calibration (judges.spot_check)
    spot_check_approved: int = field(default=0, metadata=_about(
        "about this many of each round's judge-approved rows held back for people on the review desk, beside "
        "the rejected ones (a seeded sample, every shard and score bucket at the same rate; one undecided "
        "follows the judge); the reviewers' verdicts give the judge's agreement, Cohen's kappa, precision "
        "and recall per round; 0: none", "integer", minimum=0))
    # what the run's pool does while a gate waits (run.gate.idle): GPUs idle at a gate are the cost
    gate_idle: str = field(default="auto", metadata=_about(
        "the run's workers while a review gate waits: keep (leased and warm however long it waits); sleep "
        "(leased; each worker's engine sleeps once idle gate_keep_warm_s, freeing the GPU, and wakes on the "
        "answer; refused where the engine cannot); release (the lease is kept gate_keep_warm_s, then given "
        "back: the pool scales to zero after its idle_ttl_s unless another run holds it, and the answer "
        "re-warms it); auto: release on a local or Kubernetes pool, keep on a static one", "string",
        choices=GATE_IDLE))
    gate_keep_warm_s: float = field(default=300.0, metadata=_about(
        "seconds a review gate keeps the workers warm before gate_idle sleeps or releases them (an answer "
        "within it finds them warm)", "number", minimum=0))
    # fmt: on

    def __post_init__(self) -> None:
        if self.gate_idle not in GATE_IDLE:
            raise ConfigError(f"gate_idle {self.gate_idle!r}: choose one of {', '.join(GATE_IDLE)}")
        if isinstance(self.gate_keep_warm_s, bool) or not self.gate_keep_warm_s >= 0:
            raise ConfigError(f"gate_keep_warm_s must be a number >= 0, got {self.gate_keep_warm_s!r}")
        if self.review not in REVIEW_MODES:
            raise ConfigError(f"review {self.review!r}: choose one of {', '.join(REVIEW_MODES)}")
        n = self.spot_check_approved
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(f"spot_check_approved must be an integer >= 0 (0: none), got {n!r}")


@dataclass(frozen=True)
class ShardingConfig:
    """How the records are split into shard jobs and run: the operational knobs (the trigger form's
    Advanced section)."""

    # fmt: off
    records_per_shard: int = field(default=2_000, metadata=_about(
        "records per shard: one shard job each (round 0's last shards smaller, down to an eighth, so that "
        "its lanes end together)", "integer", minimum=1, flag="--records-per-shard"))
    # shard jobs a round runs at once (run.lanes); 0: one lane per pool slot
    lanes: int = field(default=0, metadata=_about(
        "shard jobs a round runs at once, each lane taking the next unclaimed shard; 0: one per pool slot "
        "(replicas × concurrency)", "integer", minimum=0, flag="--lanes"))
    chunk_size: int = field(default=500, metadata=_about(
        "records a job holds per step", "integer", minimum=1, flag="--chunk-size"))
    unreachable_grace_s: float = field(default=UNREACHABLE_GRACE_S, metadata=_about(
        "seconds a worker that may run a shard's job is waited for when it does not answer, before a "
        "resubmission takes it for gone and starts a second copy (until then the copy is not started); at "
        "least one ask's timeout, at most half of a try's wait for a worker, so it elapses within one try",
        "number", minimum=UNREACHABLE_GRACE_MIN_S, maximum=UNREACHABLE_GRACE_MAX_S,
        flag="--unreachable-grace-s"))
    # fmt: on

    def __post_init__(self) -> None:
        if self.records_per_shard < 1:
            raise ConfigError(f"records_per_shard must be >= 1, got {self.records_per_shard}")
        if self.lanes < 0:
            raise ConfigError(f"lanes must be >= 0 (0: one lane per pool slot), got {self.lanes}")
        check_unreachable_grace(self)


@dataclass(frozen=True)
class BudgetConfig:
    """What the run may spend and tolerate: quarantined shards, a failing job's retries, the
    pre-flight sample and its GPU-hour budget."""

    # fmt: off
    max_failed_shards: int = field(default=0, metadata=_about(
        "quarantined shards the run tolerates before it fails", "integer", minimum=0,
        flag="--max-failed-shards", section="Budget & failure"))
    # the pre-flight sample (Airflow only)
    preflight_records: int = field(default=200, metadata=_about(
        "records tried before the fan-out; 0 turns pre-flight off", "integer", minimum=0))
    budget_gpu_hours: float | None = field(default=None, metadata=_about(
        "refuse a run the pre-flight projects above this many GPU-hours; empty: no budget", "number",
        nullable=True, minimum=0, section="Budget & failure"))
    job_retries: int = field(default=2, metadata=_about(
        "retries of a failing shard job before its shard is quarantined (a DAG: the factory's retries "
        "argument)", "integer", minimum=0, param=False, flag="--job-retries"))
    # fmt: on
