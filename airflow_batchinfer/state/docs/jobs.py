"""The jobs' documents: each job's completion manifest (:class:`JobManifest`, written by the worker
once its outputs are committed), what close accepted of it (``jobs/<shard>.<kind>.accepted.json``:
:class:`AcceptedJob`, or :class:`QuarantinedJob` for a shard close quarantined) and a job's last
error (:class:`JobError`, quoted when its shard is quarantined).

A completion manifest tells a finished job from a lost one even when the worker that ran it is
gone. Its ``counts`` is the job's :class:`~airflow_batchinfer.state.tally.Tally` (typed: outcomes,
per adapter, strata, jury, candidates, truncation; schema version 2), which the accepted doc copies
(the same version) and the round's close adds up. Its ``ids`` holds, per output file
(:data:`ID_OUTPUTS`) and for ``input``, the count and order-independent digest of the ids the job
read and wrote (:class:`~.io.Digest`): the round's close checks the invariant from these, in
O(shards), and opens only a shard whose digests disagree. Judge, infer_judge and in-place manifests
also carry ``reason_groups``: ``{group: rows}`` of the rows the job rejected (in place: exhausted),
by :func:`~airflow_batchinfer.judges.reasons.reason_group`, the 64 most common and ``(other)`` with
the rest (the review page's groups, without reading a row). ``engine_stats``
(:class:`EngineTelemetry`: the engine's own figures during the job, which the report adds up per
round) is there when the engine reports any."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from airflow_batchinfer.engines.stats import CounterName, GaugeName
from airflow_batchinfer.state.docs.io import Digest, DocModel, read_model, validated
from airflow_batchinfer.state.tally import Tally
from airflow_batchinfer.storage.digest import IdDigest
from airflow_batchinfer.storage.json_doc import parse_json, write_bytes
from airflow_batchinfer.storage.location import Location, StorageOptions, resolve

# A job's kind and state, on the wire (rpc.models) and in its manifest.
JobKind = Literal["infer", "judge", "infer_judge", "in_place"]
JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
TERMINAL_STATES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})

MANIFEST_VERSION = 2  # of the completion manifests, jobs/<shard>.<kind>.json (2: counts a Tally)
# of close's accepted docs, jobs/<shard>.<kind>.accepted.json: they copy a manifest's figures
ACCEPTED_VERSION = MANIFEST_VERSION
# The output files whose ids a job of each kind digests (``ids[name]``), besides ``ids["input"]``.
# An in-place job's ``rejected`` file holds its exhausted rows (``max_attempts``, ``error``).
ID_OUTPUTS: dict[str, tuple[str, ...]] = {
    "infer": ("inferred",),
    "judge": ("approved", "rejected"),
    "infer_judge": ("approved", "rejected"),
    "in_place": ("approved", "rejected"),
}


class Timings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    started_at: float
    finished_at: float
    run_s: float


class BatcherDelta(BaseModel):
    """The shared batcher's activity during one job (concurrent jobs' batches included)."""

    model_config = ConfigDict(extra="forbid")
    batches: int = 0
    avg_batch_cost: float = 0.0
    avg_fill: float = 0.0  # of the batcher's target batch cost
    busy_s: float = 0.0
    idle_s: float = 0.0
    utilization: float = 0.0


class GaugeSpan(BaseModel):
    """A gauge over a job's lifetime: the highest reading and the mean of the readings (about one a
    second, and at the job's start and end)."""

    model_config = ConfigDict(extra="forbid")
    peak: float
    mean: float


class EngineTelemetry(BaseModel):
    """The worker's engine over one job's lifetime, as the engine reports it
    (:class:`~airflow_batchinfer.engines.stats.EngineStats`: only what it can tell), shared with the
    jobs that ran beside it as the batcher's figures are. ``counters``: how much each grew during the
    job; ``at_start``: their totals when it started, which place the job on its engine's
    (``engine_id``) count, so the report merges overlapping jobs of one engine instead of adding
    their shared work twice. ``version`` is this part's own: another shape gets another number."""

    model_config = ConfigDict(extra="forbid")
    version: Literal[1] = 1
    engine_id: str  # the engine instance (one per worker process) whose counters these are
    started_at: float
    seconds: float
    samples: int  # readings taken: the gauges' peak and mean are of these
    counters: dict[CounterName, int] = Field(default_factory=dict)
    at_start: dict[CounterName, int] = Field(default_factory=dict)
    gauges: dict[GaugeName, GaugeSpan] = Field(default_factory=dict)


class JobFigures(DocModel):
    """What a job did, as its manifest records it and its accepted doc copies it (close adds up the
    tokens, timings and batcher figures of every job that counts, per worker)."""

    counts: Tally
    # per output file (ID_OUTPUTS) and ``input``: the count and digest of the ids read and written
    ids: dict[str, Digest]
    tokens: dict[str, int] = Field(default_factory=dict)
    timings: Timings
    worker: str
    batcher: BatcherDelta
    engine: dict[str, Any]
    # rows rejected (in place: exhausted) per reason group; none: an infer job (it judges nothing)
    reason_groups: dict[str, int] | None = None
    engine_stats: EngineTelemetry | None = None  # none: an engine without stats

    def digest(self, name: str) -> IdDigest | None:
        """The digest recorded for ``name`` (an output, or ``input``); ``None`` when there is none
        (not an output of the job's kind)."""
        d = self.ids.get(name)
        return None if d is None else d.digest()


class JobManifest(JobFigures):
    """A job's completion manifest, written by the worker once its outputs are committed.
    ``attempt``: the token of the worker's attempt that wrote it; ``committed`` (fenced outputs):
    where that attempt staged them (none: written in place); ``sampling``: what the outputs were
    generated with (none: the job's params had none)."""

    VERSION: ClassVar[int] = MANIFEST_VERSION
    OMIT_NONE: ClassVar[frozenset[str]] = frozenset({"reason_groups", "committed", "engine_stats"})

    job_id: str
    kind: JobKind
    state: JobState
    input: str
    outputs: dict[str, str]
    attempt: str
    round: int
    sampling: dict[str, Any] | None = None  # what the outputs were generated with (a review may change it)
    fingerprint: str
    committed: dict[str, str] | None = None


class RepeatsLeftOut(BaseModel):
    model_config = ConfigDict(extra="forbid")
    count: int
    rejects: str  # their rows' file under rejects/


class AcceptedJob(JobFigures):
    """What close accepted of a job (``jobs/<shard>.<kind>.accepted.json``): the attempt, its staged
    files (``committed``) and their final URIs, the version of the input it read and its figures.
    Round 0 with ids repeated from an earlier range: ``repeats``, ``ids.repeated`` and
    ``counts.repeated_ids`` (:func:`~airflow_batchinfer.run.repeats.drop_repeats`). A judge's infer
    job accepted at another attempt than its manifest's: ``manifest_attempt``, the manifest's."""

    VERSION: ClassVar[int] = ACCEPTED_VERSION
    OMIT_NONE: ClassVar[frozenset[str]] = frozenset({"manifest_attempt", "repeats", "engine_stats"})

    shard_id: str
    kind: JobKind
    quarantined: Literal[False] = False
    job_id: str
    fingerprint: str
    attempt: str | None
    committed: dict[str, str]  # name -> staged URI (none: written in place)
    outputs: dict[str, str]
    manifest: str
    input: str  # the input it read
    input_info: dict[str, Any] | None = None  # size, ETag, mtime of the input it read
    accepted_at: float
    manifest_attempt: str | None = None
    repeats: RepeatsLeftOut | None = None


SWEEPING: Final = "sweeping"  # a quarantine doc's ``sweep``: its close's steps running
SWEPT: Final = "swept"  # and done


class QuarantinedJob(DocModel):
    """A shard close quarantined, in place of its accepted job: ``sweep`` is ``sweeping`` while its
    close sweeps the shard, ``swept`` once done, with ``orphans_removed``."""

    VERSION: ClassVar[int] = ACCEPTED_VERSION
    OMIT_NONE: ClassVar[frozenset[str]] = frozenset({"orphans_removed"})

    shard_id: str
    kind: JobKind
    quarantined: Literal[True] = True
    sweep: Literal["sweeping", "swept"]
    phase: str
    error: str
    quarantined_at: float
    orphans_removed: list[str] | None = None

    @property
    def sweeping(self) -> bool:
        return self.sweep == SWEEPING


class JobError(DocModel):
    """A shard job's last error (``jobs/<shard>.<kind>.error.json``), kept by the task that submitted
    it: the round's close quotes it when it quarantines the shard."""

    shard_id: str
    kind: str
    error: str


AcceptedDoc = Annotated[AcceptedJob | QuarantinedJob, Field(discriminator="quarantined")]
_ACCEPTED: TypeAdapter[AcceptedJob | QuarantinedJob] = TypeAdapter(AcceptedDoc)
_MANIFEST = TypeAdapter(JobManifest)
_JOB_ERROR = TypeAdapter(JobError)
_MANIFEST_REMEDY = "delete it to rerun the job"
_ACCEPTED_REMEDY = "delete it to redo that step"


def write_job_manifest(uri: str, manifest: JobManifest, so: StorageOptions | None = None) -> None:
    write_bytes(resolve(uri, so), manifest.encode())


def read_job_manifest(uri: str, so: StorageOptions | None = None) -> JobManifest | None:
    """The manifest, or ``None`` when the job has not completed. Unreadable ones (and unknown
    versions or fields) are errors."""
    return read_model(_MANIFEST, uri, "job manifest", so, version=MANIFEST_VERSION, remedy=_MANIFEST_REMEDY)


def read_accepted(uri: str, so: StorageOptions | None = None) -> AcceptedJob | QuarantinedJob | None:
    """A shard's accepted doc (accepted or quarantined), or ``None`` when close decided nothing yet."""
    return read_model(_ACCEPTED, uri, "accepted job", so, version=ACCEPTED_VERSION, remedy=_ACCEPTED_REMEDY)


def parse_accepted(loc: Location, raw: bytes) -> AcceptedJob | QuarantinedJob:
    """An accepted doc from its stored bytes (what a compare-and-swap read), checked as
    :func:`read_accepted` checks it."""
    data = parse_json(loc, raw, schema_version=ACCEPTED_VERSION, what="accepted job", remedy=_ACCEPTED_REMEDY)
    return validated(_ACCEPTED, loc, data, "accepted job", _ACCEPTED_REMEDY)


def write_accepted(uri: str, doc: AcceptedJob | QuarantinedJob, so: StorageOptions | None = None) -> None:
    write_bytes(resolve(uri, so), doc.encode())


def write_job_error(uri: str, note: JobError, so: StorageOptions | None = None) -> None:
    write_bytes(resolve(uri, so), note.encode())


def read_job_error(uri: str, so: StorageOptions | None = None) -> JobError | None:
    """A job's last error, or ``None`` when none was kept."""
    return read_model(_JOB_ERROR, uri, "job error", so)
