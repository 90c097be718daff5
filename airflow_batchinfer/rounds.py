"""Rounds: what to run next, the jobs a round runs, and closing a round. Shared by the Airflow
operators and ``batchinfer run``, so both make the same decisions from the same files.

Storage is the truth. A run root holds ``run.json`` (settings), and per round slot a ``plan.json``
(what the controller decided and why), the jobs' completion manifests, ``failed/`` quarantine
records and ``summary.json``. Slots are ``round-00`` … ``round-{max_rounds-1}`` (infer + judge) and
``tail`` (in-place retry of whatever rounds left, under the next free round number).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import logging
import posixpath
import re
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from airflow_batchinfer.exceptions import ConfigError, ReviewError, StorageError
from airflow_batchinfer.layout import (
    FENCED_OUTPUTS,
    INFERRED,
    SHARD_SUFFIX,
    RunLayout,
    fenced_outputs,
    staged_attempt,
)
from airflow_batchinfer.limits import TriggerLimits, refusals
from airflow_batchinfer.review.reasons import OTHER, reason_group, row_reason
from airflow_batchinfer.rpc.fingerprint import fingerprint, pin_input, spec_key
from airflow_batchinfer.rpc.models import JobKind, JobSpec
from airflow_batchinfer.run_config import RunConfig
from airflow_batchinfer.storage import (
    JsonlDir,
    JsonlFile,
    ShardDescriptor,
    files,
    recompact,
    shard_dataset,
    swap,
)
from airflow_batchinfer.storage.digest import (
    IdDiff,
    IdDigest,
    diff_ids,
    file_digest,
    file_ids,
    id_bytes,
    record_ids,
)
from airflow_batchinfer.storage.id_hashes import Repeat, Repeats, find_repeats, hashes_beside, rejects_uri
from airflow_batchinfer.storage.json_doc import encode_json, parse_json, read_json, write_json
from airflow_batchinfer.storage.jsonl_dir import DEFAULT_BYTES_PER_SHARD
from airflow_batchinfer.storage.location import Location, StorageOptions, join, resolve
from airflow_batchinfer.storage.manifest import read_manifest, write_manifest
from airflow_batchinfer.storage.ranges import range_ids, range_params, read_range, shard_ranges
from airflow_batchinfer.storage.sharding import ShardingResult
from airflow_batchinfer.worker.manifest import manifest_ids, read_job_manifest

log = logging.getLogger("airflow_batchinfer.rounds")

TAIL = "tail"
WORKER_FIELDS = ("jobs", "job_seconds", "engine_busy_s", "fill_sum", "tokens")
Mode = Literal["rounds", "in_place", "skip"]

# Review gate options (the Required Actions page shows them as buttons).
CONTINUE = "Continue"
CONTINUE_IN_PLACE = "Continue in place"
ACCEPT = "Accept remaining as they are"
STOP = "Stop"

# Why a run stopped; the first is a normal completion, the rest are reported as what they are.
NOTHING_PENDING = "nothing pending"
MAX_ROUNDS = "max_rounds reached"
STOPPED_BY_REVIEW = "stopped by review"
ACCEPTED_BY_REVIEW = "remaining accepted by review"
IN_PLACE_DONE = "in-place retry finished"


def slots(max_rounds: int) -> list[str]:
    return [f"round-{r:02d}" for r in range(max_rounds)] + [TAIL]


DOC_VERSION = 1  # of run.json, plan.json, summary.json, failed/ records and jobs/*.accepted.json


def read_doc(uri: str, what: str, so: StorageOptions | None = None) -> dict[str, Any] | None:
    return read_json(
        resolve(uri, so), schema_version=DOC_VERSION, what=what, remedy="delete it to redo that step"
    )


def write_doc(uri: str, data: dict[str, Any], so: StorageOptions | None = None) -> None:
    write_json(resolve(uri, so), data, schema_version=DOC_VERSION)


def run_key(run_root: str) -> str:
    """Part of every job id: warm workers shared by several runs never confuse their jobs."""
    return hashlib.sha256(resolve(run_root).uri.encode()).hexdigest()[:10]


# ------------------------------------------------------------------------------------ settings
def write_run_config(cfg: RunConfig, storage_options: StorageOptions | None = None) -> None:
    write_doc(RunLayout(cfg.run_root).run_config, cfg.to_dict(), storage_options)


def read_run_config(run_root: str, storage_options: StorageOptions | None = None) -> RunConfig:
    data = read_doc(RunLayout(run_root).run_config, "run settings", storage_options)
    if data is None:
        raise ConfigError(f"{RunLayout(run_root).run_config} is missing: the run's first task writes it")
    data.pop("schema_version", None)
    return RunConfig.from_dict(data)


def prepare_run(
    cfg: RunConfig, so: StorageOptions | None = None, *, max_shards: int | None = None
) -> ShardingResult:
    """A run's first step: validate the settings, shard the input (reused when identical), refuse
    more than ``max_shards`` shards with the remedy, and store ``run.json`` (``cfg.id_field`` set)."""
    cfg.validate()
    layout = RunLayout(cfg.run_root)
    result = shard_input(cfg, layout, so)
    if max_shards is not None and len(result.shards) > max_shards:
        records = result.counts.get("records", 0)
        raise ConfigError(
            f"{len(result.shards)} shards, but a round maps one task per shard and this deployment "
            f"allows {max_shards} ([core] max_map_length). Remedy: raise records_per_shard to at least "
            f"{-(-records // max_shards)}, or raise max_map_length (AIRFLOW__CORE__MAX_MAP_LENGTH) on the "
            "scheduler and workers."
        )
    cfg.id_field = result.id_field
    write_run_config(cfg, so)
    return result


def shard_input(cfg: RunConfig, layout: RunLayout, so: StorageOptions | None) -> ShardingResult:
    """Round 0's shards: byte ranges of the input (plain JSONL, multi-frame zstd: nothing copied,
    see :mod:`~airflow_batchinfer.storage.ranges`), or, for input that cannot be split (one zstd
    frame), shards copied from it as before."""
    rps, id_field, assign = cfg.records_per_shard, cfg.id_field, cfg.assign_ids
    max_line, max_id = cfg.max_line_bytes, cfg.max_id_bytes
    planned = shard_ranges(
        cfg.input, layout.input, records_per_shard=rps, max_bytes_per_shard=DEFAULT_BYTES_PER_SHARD,
        id_field=id_field, assign_ids=assign, rejects=layout.rejects, storage_options=so,
        max_line_bytes=max_line, max_id_bytes=max_id,
    )  # fmt: skip
    if planned is None:
        return shard_dataset(
            cfg.input, layout.input, records_per_shard=rps, id_field=id_field, assign_ids=assign,
            rejects=layout.rejects, storage_options=so, max_line_bytes=max_line, max_id_bytes=max_id,
        )  # fmt: skip
    shards, manifest, reused = planned
    return ShardingResult(
        shards=shards,
        counts=manifest["counts"],
        id_field=manifest.get("id_field") or cfg.id_field or "id",
        rejects_uri=manifest["rejects_uri"],
        reused=reused,
    )


# ---------------------------------------------------------------------------------------- jobs
def round_kinds(cfg: RunConfig, mode: Mode) -> tuple[JobKind, ...]:
    """The jobs a round of ``mode`` runs per shard, in order; the last one's outputs are accepted.
    A judge on the run's pool is fused with inference (the shard is read once, no inferred file);
    a judge with its own pool (``judge_pool``) runs after inference, shard by shard."""
    if mode == "in_place":
        return ("in_place",)
    return ("infer", "judge") if cfg.judge_pool else ("infer_judge",)


def job_spec(cfg: RunConfig, kind: JobKind, r: int, shard: ShardDescriptor) -> JobSpec:
    """The job a round runs for one shard (``shard["uri"]`` is the job's input). Every kind carries
    ``outputs["staging"]``: the worker writes its outputs (approved and rejected rows; an infer job's
    inferred rows) under an attempt token there, and :func:`close_round` moves one attempt's files to
    the final URIs. A judge's input is :func:`judge_input`."""
    layout = RunLayout(cfg.run_root)
    sid = shard["shard_id"]
    params: dict[str, Any]
    if kind == "infer":
        outputs = {
            "inferred": layout.inferred(r, sid),
            "manifest": layout.job_manifest(r, sid, kind),
            "staging": layout.staging(r),  # fenced: a late copy never rewrites what a judge read
        }
        params = cfg.infer_params()
    elif kind in ("judge", "infer_judge"):
        outputs = {
            "approved": layout.result(r, sid),
            "rejected": layout.rejected(r, sid),
            "manifest": layout.job_manifest(r, sid, kind),
            "staging": layout.staging(r),  # fenced: close accepts one attempt's outputs, once
        }
        params = cfg.judge_params() if kind == "judge" else {**cfg.infer_params(), **cfg.judge_params()}
    else:
        outputs = {
            "approved": layout.result(r, sid, tail=True),
            "rejected": layout.rejected(r, sid),
            "checkpoints": layout.checkpoints(r, sid),
            "manifest": layout.job_manifest(r, sid, kind),
            "staging": layout.staging(r),
        }
        params = cfg.in_place_params()
    spec = JobSpec(
        job_id="x",
        kind=kind,
        input=shard["uri"],
        outputs=outputs,
        params={**params, "round": r, "input_records": shard["records"]},
    )
    _read_range_job(cfg, r, shard, spec)
    # The id names the run, the shard and what is asked: resubmitting it is idempotent, and a changed
    # request (other settings) is a new job rather than a conflict with a remembered one.
    spec.job_id = f"{run_key(cfg.run_root)}-r{r:02d}-{sid}-{kind}-{spec_key(spec)}"
    return spec


def _read_range_job(cfg: RunConfig, r: int, shard: ShardDescriptor, spec: JobSpec) -> None:
    """A job whose input is a round-0 range shard reads and validates just that range: it gets
    ``params.input_range`` and an ``input_rejects`` output for the lines it rejects."""
    extra = range_params(shard, id_field=cfg.id_field, assign_ids=cfg.assign_ids)
    if extra and spec.input == shard["uri"]:
        spec.params.update(extra)
        spec.outputs["input_rejects"] = RunLayout(cfg.run_root).range_rejects(r, shard["shard_id"])


def inferred_shard(cfg: RunConfig, r: int, shard: ShardDescriptor) -> ShardDescriptor:
    """The descriptor of a shard the round inferred (its final ``inferred/`` file): what the judge
    task is mapped over. The judge job itself reads :func:`judge_input`."""
    return {
        "shard_id": shard["shard_id"],
        "uri": RunLayout(cfg.run_root).inferred(r, shard["shard_id"]),
        "records": shard["records"],
    }


def judge_input(
    cfg: RunConfig, r: int, shard: ShardDescriptor, so: StorageOptions | None = None
) -> ShardDescriptor:
    """What a judge submitted now reads: the infer attempt the infer manifest names (a late copy of
    the infer job writes an attempt of its own, never this one), or the final ``inferred/`` file
    once close accepted that job (its attempt promoted there) or for an infer job that wrote it in
    place. Close accepts the infer attempt the accepted judge read (its manifest's ``input``)."""
    layout = RunLayout(cfg.run_root)
    desc = inferred_shard(cfg, r, shard)
    m = read_job_manifest(layout.job_manifest(r, shard["shard_id"], "infer"), so)
    staged = ((m or {}).get("committed") or {}).get(INFERRED)
    if m is None or not staged:
        return desc
    acc = read_doc(layout.accepted(r, shard["shard_id"], "infer"), "accepted job", so) or {}
    if not acc.get("quarantined") and (acc.get("job_id"), acc.get("fingerprint")) == (
        m.get("job_id"),
        m.get("fingerprint"),
    ):
        return desc  # accepted: its attempt is in inferred/, whatever a later copy staged since
    return {**desc, "uri": staged}


def record_job_error(
    cfg: RunConfig, r: int, shard_id: str, kind: str, error: str, storage_options: StorageOptions | None
) -> None:
    """Keep the last error of a shard's job next to its manifest: ``close`` quotes it when it
    quarantines the shard."""
    uri = RunLayout(cfg.run_root).job_error(r, shard_id, kind)
    write_doc(uri, {"shard_id": shard_id, "kind": kind, "error": error}, storage_options)


# --------------------------------------------------------------------------------------- plans
@dataclass
class Plan:
    """What one round slot does. ``stop`` is set on the plan that ends the run."""

    slot: str
    round: int
    mode: Mode
    shards: list[ShardDescriptor] = field(default_factory=list)
    reason: str = ""
    stop: str | None = None
    switch_in_place: bool = False
    review: dict[str, Any] | None = None
    # What the round's pool runs (engine, model, engine args), recorded when the round starts: close
    # counts only jobs run by it, so a resume on another model never keeps the old model's rows.
    engine: dict[str, Any] | None = None
    # The same for the judge's own pool (``judge_pool``), when it has one.
    judge_engine: dict[str, Any] | None = None
    # Rows a review accepted as they are: the count and digest of their ids (the report counts them).
    accepted: dict[str, Any] | None = None
    # Settings a review changed for this round and the ones after it (see GATE_CHANGES), over
    # run.json's: inherited from the plan before, so a change holds until changed again.
    settings: dict[str, Any] | None = None
    # What the reviewers' decisions on the previous round's rejected rows did when the gate was
    # answered (:func:`airflow_batchinfer.review.apply.apply_decisions`): counts and id digests.
    reviewed: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @property
    def records(self) -> int:
        return sum(s["records"] for s in self.shards)


@dataclass
class Proposal:
    """The controller's decision before review; ``options`` is non-empty when a person must confirm."""

    plan: Plan
    options: list[str] = field(default_factory=list)
    last: dict[str, Any] | None = None  # the previous round's summary (what the review shows)


# What a reviewer may change for the next rounds with the gate's answer: sampling keys and templates.
GATE_CHANGES = {"temperature": "sampling", "max_tokens": "sampling", "prompt_template": None, "system": None}


def changed_settings(previous: dict[str, Any] | None, changes: dict[str, Any]) -> dict[str, Any] | None:
    """``previous`` (a plan's settings) with a reviewer's ``changes`` (``None``: unchanged), checked."""
    unknown = set(changes) - set(GATE_CHANGES)
    if unknown:
        raise ConfigError(f"a review may change {sorted(GATE_CHANGES)}, not {sorted(unknown)}")
    settings = {**(previous or {}), **{k: v for k, v in changes.items() if v is not None}}
    return settings or None


def current_settings(cfg: RunConfig) -> dict[str, Any]:
    """The values of :data:`GATE_CHANGES` that ``cfg`` runs with (what a gate's form shows)."""
    return {
        k: (cfg.sampling.get(k) if where == "sampling" else getattr(cfg, k))
        for k, where in GATE_CHANGES.items()
    }


def gate_changes(current: dict[str, Any], answered: dict[str, Any]) -> dict[str, Any]:
    """What a gate's answer changes: the answered values that are set and differ from ``current``."""
    return {k: v for k, v in answered.items() if k in GATE_CHANGES and v is not None and v != current.get(k)}


def gate_refusals(changed: RunConfig, settings: dict[str, Any], limits: TriggerLimits) -> list[str]:
    """Why the settings a review changed go over the deployment's caps (``[]``: they do not), decided
    by :func:`~airflow_batchinfer.limits.refusals` as for a trigger's params. ``changed``: the config
    the next rounds would run (a sampling key is checked with the whole sampling, as the engines read
    it: ``max_completion_tokens`` before ``max_tokens``, 256 when neither is set)."""
    params = {k: getattr(changed, k) for k in settings if GATE_CHANGES[k] != "sampling"}
    if any(GATE_CHANGES[k] == "sampling" for k in settings):
        params["sampling"] = changed.sampling
    return refusals(params, limits)


def round_config(cfg: RunConfig, plan: Plan | None) -> RunConfig:
    """The run's settings as ``plan``'s round runs them: run.json with the review's changes
    (validated as the workers will: a bad template fails here, not in every job). Job ids and
    fingerprints follow, so a changed round never reuses the old settings' outputs."""
    if plan is None or not plan.settings:
        return cfg
    sampling = dict(cfg.sampling)
    other: dict[str, Any] = {}
    for key, value in plan.settings.items():
        if GATE_CHANGES.get(key) == "sampling":
            sampling[key] = value
        elif key in GATE_CHANGES:
            other[key] = value
    return dataclasses.replace(cfg, sampling=sampling, **other).validate()


def plan_for(cfg: RunConfig, shard: ShardDescriptor, so: StorageOptions | None = None) -> Plan | None:
    """The plan of the round slot a shard descriptor names, when its settings differ from run.json's
    (the descriptor then carries ``slot``)."""
    slot = shard.get("slot")
    return read_plan(RunLayout(cfg.run_root), str(slot), so) if slot else None


def _plan_uri(layout: RunLayout, slot: str) -> str:
    return join(layout.root, TAIL if slot == TAIL else slot, "plan.json")


def read_plan(layout: RunLayout, slot: str, so: StorageOptions | None = None) -> Plan | None:
    data = read_doc(_plan_uri(layout, slot), "round plan", so)
    if data is None:
        return None
    data.pop("schema_version", None)
    return Plan(**data)


def write_plan(layout: RunLayout, plan: Plan, so: StorageOptions | None = None) -> None:
    write_doc(_plan_uri(layout, plan.slot), plan.as_dict(), so)


def read_summary(layout: RunLayout, r: int, so: StorageOptions | None = None) -> dict[str, Any] | None:
    return read_doc(layout.summary(r), "round summary", so)


def _review_split(layout: RunLayout, r: int, so: StorageOptions | None) -> dict[str, Any] | None:
    """The manifest of round ``r``'s pending set as reviewers' decisions left it, once complete."""
    if r < 1:
        return None
    split = read_manifest(JsonlDir(layout.reviewed(r), storage_options=so))
    return split if split is not None and split.get("state") == "complete" else None


def review_applied(layout: RunLayout, r: int, so: StorageOptions | None = None) -> dict[str, Any] | None:
    """What reviewers' decisions did to round ``r``'s pending set (counts, accepted and dropped id
    digests), once per round whichever gate applied them; ``None`` when none did."""
    split = _review_split(layout, r, so)
    return split.get("applied") if split is not None else None


def rounds_ran(layout: RunLayout, max_rounds: int, so: StorageOptions | None = None) -> int:
    """How many of the round slots before the tail ran a round (their plans in storage)."""
    return sum(1 for s in slots(max_rounds)[:-1] if (p := read_plan(layout, s, so)) and p.mode == "rounds")


def pending_shards(
    layout: RunLayout, r: int, so: StorageOptions | None = None, *, reviewed: bool = True
) -> list[ShardDescriptor]:
    """Round ``r``'s input: the sharded dataset, or what round ``r - 1`` recompacted; once a
    review's decisions took effect (``reviewed``), what they left pending."""
    split = _review_split(layout, r, so) if reviewed else None
    if split is not None:
        return [s for s in split.get("shards", []) if s["records"]]
    manifest = read_manifest(JsonlDir(layout.pending(r), storage_options=so))
    if manifest is None or manifest.get("state") != "complete":
        raise ConfigError(f"{layout.pending(r)} is not complete: its writer (shard or close) did not finish")
    return [s for s in manifest.get("shards", []) if s["records"]]


def propose(cfg: RunConfig, slot: str, so: StorageOptions | None = None) -> Proposal:
    """Decide what ``slot`` does from the plans and summaries before it (a pure function of storage)."""
    layout = RunLayout(cfg.run_root)
    all_slots = slots(cfg.max_rounds)
    if slot not in all_slots:
        if re.fullmatch(r"round-\d{2}", slot) and int(slot[6:]) >= cfg.max_rounds:
            # a DAG built with more round slots than this run's max_rounds: the slot has no round
            return Proposal(
                Plan(
                    slot,
                    rounds_ran(layout, cfg.max_rounds, so),
                    "skip",
                    reason=f"max_rounds is {cfg.max_rounds}: this slot is not used",
                )
            )
        raise ConfigError(f"round slot {slot!r} is not one of {all_slots}")
    prior = [p for s in all_slots[: all_slots.index(slot)] if (p := read_plan(layout, s, so))]
    r = sum(1 for p in prior if p.mode == "rounds")
    stopped = next((p for p in prior if p.stop), None)
    if stopped is not None:
        return Proposal(Plan(slot, r, "skip", reason=f"the run stopped at {stopped.slot}: {stopped.stop}"))
    if any(p.mode == "in_place" for p in prior):
        return Proposal(Plan(slot, r, "skip", reason="in-place retry already ran"))
    pending = pending_shards(layout, r, so)
    if not pending:
        return Proposal(Plan(slot, r, "skip", reason="nothing pending", stop=NOTHING_PENDING))
    last = read_summary(layout, r - 1, so) if r else None
    switched = cfg.strategy == "in_place" or any(p.switch_in_place for p in prior)
    if slot == TAIL:
        if switched or cfg.strategy == "hybrid":
            plan = Plan(slot, r, "in_place", pending, reason="retry what rounds left, in place")
        else:
            plan = Plan(slot, r, "skip", pending, reason=f"{r} rounds ran", stop=MAX_ROUNDS)
        options = [CONTINUE_IN_PLACE, ACCEPT, STOP]
    else:
        options = [CONTINUE, CONTINUE_IN_PLACE, ACCEPT, STOP]
        shrink = _approval(last)
        if switched:
            plan = Plan(slot, r, "skip", reason="in place from here: the tail slot retries the rest")
        elif cfg.strategy == "hybrid" and shrink is not None and shrink < cfg.hybrid_min_shrink:
            plan = Plan(
                slot,
                r,
                "skip",
                reason=f"round {r - 1} approved {shrink:.0%} of its pending set "
                f"(< {cfg.hybrid_min_shrink:.0%}): switching to in place",
                switch_in_place=True,
            )
        else:
            plan = Plan(slot, r, "rounds", pending, reason=f"round {r} on {len(pending)} pending shards")
    plan.settings = next((p.settings for p in reversed(prior) if p.settings), None)
    if r == 0 or (switched and plan.mode == "skip" and plan.stop is None):
        return Proposal(plan, last=last)  # nothing to review yet / the decision was already made
    approval = _approval(last)
    if any(p.review and p.round == r for p in prior):
        return Proposal(plan, last=last)  # this round's gate was answered already (Continue in place)
    if cfg.judge.get("type") == "human":
        options = [o for o in options if o != CONTINUE_IN_PLACE]  # no person answers inside a job
    review = (
        cfg.review == "every_round"
        or (cfg.review == "on_low_approval" and approval is not None and approval < cfg.review_min_approval)
        # people judge: after a human-judged round, or one whose low-scored verdicts await them
        or cfg.judge.get("type") == "human"
        or bool((last or {}).get("for_review"))
    )
    return Proposal(plan, options if review else [], last)


def _approval(summary: dict[str, Any] | None) -> float | None:
    if not summary or not summary.get("pending"):
        return None
    return float(summary.get("approved", 0)) / float(summary["pending"])


def apply_choice(
    cfg: RunConfig,
    proposal: Proposal,
    choice: str,
    *,
    by: str = "review",
    so: StorageOptions | None = None,
    changes: dict[str, Any] | None = None,
    limits: TriggerLimits | None = None,
) -> Plan:
    """Turn a review answer into the slot's plan (accepting copies the pending rows into results);
    ``changes`` (see :data:`GATE_CHANGES`) hold for this round and the next ones. ``limits``: the
    limits in force for the run; an answer whose changes go over a cap is refused
    (:class:`~airflow_batchinfer.exceptions.ReviewError`) before anything of it is applied."""
    from airflow_batchinfer.review.apply import apply_decisions  # the review package reads rounds

    plan = proposal.plan
    layout = RunLayout(cfg.run_root)
    # The reviewers' decisions on the rejected rows take effect whatever the answer; the rest (retry)
    # is what the answer acts on.
    review: dict[str, Any] = {"choice": choice, "by": by, "proposed": plan.mode,
                              "proposed_reason": plan.reason}  # fmt: skip
    settings = changed_settings(plan.settings, changes or {})
    if settings != plan.settings:  # refused before anything is written
        review["changes"] = {k: v for k, v in (changes or {}).items() if v is not None}
        changed = round_config(cfg, Plan(plan.slot, plan.round, plan.mode, settings=settings))
        if limits is not None and (over := gate_refusals(changed, settings or {}, limits)):
            raise ReviewError(
                f"{plan.slot}: the answer of {by} is refused, nothing of it was applied: {'; '.join(over)}. "
                "Remedy: clear this plan task (with its downstream tasks) to open its review again, and "
                "answer within the caps"
            )
    applied = apply_decisions(cfg, plan.round, pending_shards(layout, plan.round, so, reviewed=False), so)
    pending = applied.shards if applied is not None else plan.shards or pending_shards(layout, plan.round, so)
    if choice != ACCEPT or not pending:  # a retried gate task: an earlier "Accept remaining" is undone
        _remove_accepted(layout, plan.round, set(), so)
    if applied is not None and not pending and choice != STOP:  # every row decided: nothing to run
        reason = f"{by} decided every pending row ({applied.counts})"
        chosen = Plan(plan.slot, plan.round, "skip", reason=reason, stop=NOTHING_PENDING, review=review)
    else:
        chosen = _apply_choice(cfg, layout, plan, pending, choice, by, review, so)
    chosen.settings = settings
    chosen.reviewed = applied.to_dict() if applied is not None else None
    return chosen


def _apply_choice(
    cfg: RunConfig,
    layout: RunLayout,
    plan: Plan,
    pending: list[ShardDescriptor],
    choice: str,
    by: str,
    review: dict[str, Any],
    so: StorageOptions | None,
) -> Plan:
    if choice == CONTINUE:
        return Plan(
            plan.slot, plan.round, "rounds", pending, reason=f"{by} chose another round", review=review
        )
    if choice == CONTINUE_IN_PLACE:
        if plan.slot == TAIL:
            return Plan(
                plan.slot, plan.round, "in_place", pending, reason=f"{by} chose in place", review=review
            )
        reason = f"{by} chose in place: the tail slot retries the rest"
        return Plan(plan.slot, plan.round, "skip", reason=reason, switch_in_place=True, review=review)
    if choice == ACCEPT:
        accepted = accept_pending(layout, plan.round, pending, so, id_field=cfg.id_field or "id")
        return Plan(
            plan.slot,
            plan.round,
            "skip",
            reason=f"{by} accepted {accepted.count} remaining rows as they are",
            stop=ACCEPTED_BY_REVIEW,
            review=review,
            accepted=accepted.to_dict(),
        )
    if choice == STOP:
        return Plan(plan.slot, plan.round, "skip", reason=f"{by} stopped the run", stop=STOPPED_BY_REVIEW,
                    review=review)  # fmt: skip
    raise ConfigError(f"review answer {choice!r} is not one of {[CONTINUE, CONTINUE_IN_PLACE, ACCEPT, STOP]}")


def accept_pending(
    layout: RunLayout,
    r: int,
    pending: Iterable[ShardDescriptor],
    so: StorageOptions | None = None,
    *,
    id_field: str = "id",
) -> IdDigest:
    """Copy round ``r``'s pending rows into ``results/accepted-rNN-…``, marked as accepted by review.
    Returns the count and digest of the ids copied (the plan records them for the report)."""
    accepted = IdDigest()
    pending = list(pending)
    _remove_accepted(layout, r, {f"accepted-r{r:02d}-{shard['shard_id']}.jsonl.zst" for shard in pending}, so)
    for shard in pending:
        dst = join(layout.results, f"accepted-r{r:02d}-{shard['shard_id']}.jsonl.zst")
        ids: list[Any] = []
        with JsonlFile(dst, storage_options=so).writer_sync() as out:
            for row in JsonlFile(shard["uri"], storage_options=so).iter_records():
                out.write({**row, "accepted_by_review": True})
                ids.append(row.get(id_field))
        accepted.add_many(ids)
    return accepted


def _remove_accepted(layout: RunLayout, r: int, keep: set[str], so: StorageOptions | None) -> None:
    """Rows an earlier answer to round ``r``'s gate accepted as they were, that this answer does not."""
    files.remove_others(layout.results, f"accepted-r{r:02d}-", {join(layout.results, n) for n in keep}, so)


# --------------------------------------------------------------------------------------- close
STALE = (
    "{uri} was written under other settings or for another input version: re-run the DAG run to recompute it"
)
ACCEPTED_FIELDS = ("counts", "ids", "tokens", "timings", "worker", "batcher", "engine", "reason_groups")
MAX_NAMED = 20  # ids named per list (lost, doubled, unexpected) in a summary or the report


@dataclass
class _Settled:
    """What close decided for one shard."""

    shard: ShardDescriptor
    jobs: list[dict[str, Any]]  # valid manifests / the accepted doc: tokens, timings, workers
    counts: dict[str, Any] | None  # the accepted attempt's counts; None when quarantined
    failed: dict[str, Any] | None = None
    orphans: list[str] = field(default_factory=list)
    accepted: dict[str, Any] | None = None  # the accepted doc (its ``ids``, final ``outputs``)
    # The id accounting (see _account): the shard's digest, its outputs' digests (None when
    # quarantined), whether its files were read, and what reading them found.
    planned: IdDigest = field(default_factory=IdDigest)
    # A round-0 range shard's line counts as read (lines, records, blank, skipped, quarantined).
    read: dict[str, int] | None = None
    outputs: dict[str, IdDigest] | None = None
    opened: bool = False
    diff: IdDiff | None = None


def close_round(cfg: RunConfig, plan: Plan, so: StorageOptions | None = None) -> dict[str, Any] | None:
    """Account for every shard the plan ran, accepting each shard's outputs once.

    Per shard (8 threads): every job's completion manifest must match the round's *current* settings
    and input versions (job id and fingerprint recomputed); the accounting job (judge, or in_place)
    is then accepted once: ``jobs/<shard>.<kind>.accepted.json`` records the attempt, and that
    attempt's staged outputs are moved to ``results/`` and ``rejected/`` (a copy that finishes later is
    never promoted). A shard without a valid manifest is quarantined into ``failed/`` and any final
    output close did not promote is removed. Then: check the counts, recompact the rejected set into
    the next round's pending set and write ``summary.json``. ``None`` for a skipped slot. Re-running
    it is safe: accepted shards stay as they are, and a quarantined shard whose job has since
    finished is accepted then.

    The id invariant is checked from digests, in O(shards) and without reading a row: per shard, the
    plan's digest of its ids must equal the accepted job's approved + rejected digests (a quarantined
    shard accounts for its whole planned digest), and the recompacted next pending set's digest
    must equal the rejected files' sum. Only a shard whose digests disagree, or that has none (a
    manifest or plan written before digests), is opened: its ids are read and the lost, doubled or
    unexpected ones named (as is the rejected set when the recompaction's digest disagrees)."""
    if plan.mode == "skip":
        return None
    cfg = round_config(cfg, plan)
    layout = RunLayout(cfg.run_root)
    r = plan.round
    kinds = round_kinds(cfg, plan.mode)
    # What ran each kind: a judge with its own pool is checked against that pool's engine.
    engines: dict[str, dict[str, Any] | None] = {
        k: plan.judge_engine if k == "judge" else plan.engine for k in kinds
    }
    already_failed = set(files.names(layout.failed(r), so))
    id_field = cfg.id_field or "id"

    def settle(shard: ShardDescriptor) -> _Settled:
        repeated = repeats.of(shard["shard_id"])  # later occurrences of ids an earlier range holds
        x = _settle(cfg, layout, r, shard, kinds, already_failed, engines, so, repeated)
        x = _settle_range(cfg, layout, r, x, so)
        _settle_repeats(layout, r, x, repeated, id_field, so)
        return _account(x, id_field, so, cfg.assign_ids)

    # before any shard is accepted: the repeats are left out of what it accepts
    with _range_repeats(cfg, layout, so) if r == 0 else Repeats() as repeats, ThreadPoolExecutor(8) as ex:
        settled = list(ex.map(settle, plan.shards))
    _close_input_ranges(layout, settled, so)
    pending_records = sum(x.shard["records"] for x in settled)  # a range shard's, as read
    orphans = [u for x in settled for u in x.orphans]
    orphans += _remove_unplanned(layout, r, plan, so)
    counts: dict[str, int] = {}
    tokens: dict[str, int] = {}
    job_seconds = 0.0
    failed: list[dict[str, Any]] = []
    workers: dict[str, dict[str, float]] = {}
    for x in settled:
        if x.failed is not None:
            failed.append(x.failed)
        for k, v in (x.counts or {}).items():
            counts[k] = counts.get(k, 0) + int(v)
        for m in x.jobs:  # every job that counts, infer and judge alike
            run_s = float((m.get("timings") or {}).get("run_s", 0.0))
            job_tokens = m.get("tokens") or {}
            for k, v in job_tokens.items():
                tokens[k] = tokens.get(k, 0) + int(v)
            job_seconds += run_s
            w = workers.setdefault(str(m.get("worker")), dict.fromkeys(WORKER_FIELDS, 0.0))
            batcher = m.get("batcher") or {}
            w["jobs"] += 1
            w["job_seconds"] += run_s
            w["engine_busy_s"] += float(batcher.get("busy_s", 0.0))
            w["fill_sum"] += float(batcher.get("avg_fill", 0.0))
            w["tokens"] += sum(job_tokens.values())
    failed_records = sum(f["records"] for f in failed)
    planned_ids, failed_ids = IdDigest(), IdDigest()
    out_ids = {name: IdDigest() for name in (*FENCED_OUTPUTS, REPEATED)}
    for x in settled:
        planned_ids += x.planned
        if x.outputs is None:
            failed_ids += x.planned  # a quarantined shard accounts for its whole input
        else:
            for name, d in x.outputs.items():
                out_ids[name] += d
    diffs = [x.diff for x in settled if x.diff is not None]
    summary: dict[str, Any] = {
        "round": r,
        "slot": plan.slot,
        "mode": plan.mode,
        "pending": pending_records,
        "shards": len(plan.shards),
        "approved": counts.get("approved", 0),
        "failed_shards": failed,
        "failed_records": failed_records,
        "orphans_removed": orphans,
        "tokens": tokens,
        "job_seconds": round(job_seconds, 3),
        "workers": workers,  # per worker: jobs, job_seconds, engine_busy_s, fill_sum, tokens
    }
    if plan.mode == "rounds":
        summary["rejected"] = counts.get("rejected", 0)
        summary["inference_errors"] = counts.get("inference_errors", 0)
        summary["for_review"] = counts.get("for_review", 0)  # rejected rows that await people
        judged = {
            x.shard["shard_id"]: int(x.counts.get("rejected", 0)) for x in settled if x.counts is not None
        }
        nxt = recompact(
            layout.rejected_dir(r),
            layout.pending(r + 1),
            records_per_shard=cfg.records_per_shard,
            counts=judged,
            workers=8,
            storage_options=so,
            overwrite=True,
            id_field=id_field,
        )
        summary["next_pending"] = nxt.records
        accounted = summary["approved"] + summary["rejected"] + failed_records + out_ids[REPEATED].count
        next_ids = IdDigest.maybe(nxt.ids)
        if next_ids is None:  # an output recompacted before digests existed: read it
            next_ids = IdDigest()
            for desc in nxt.shards:
                next_ids += file_digest(JsonlFile(desc["uri"], storage_options=so), id_field)
        if next_ids != out_ids["rejected"]:
            log.error("round %d: the next pending set's ids differ from the rejected files': reading both", r)
            rejected_dir = JsonlDir(layout.rejected_dir(r), storage_options=so)
            sources = [rejected_dir.file(s.name) for s in rejected_dir.shards()]
            targets = [JsonlFile(d["uri"], storage_options=so) for d in nxt.shards]
            diffs.append(_diff(sources, targets, id_field))
        recompacted_ok = nxt.records == summary["rejected"] and next_ids == out_ids["rejected"]
        ids = {"planned": planned_ids, "approved": out_ids["approved"], "rejected": out_ids["rejected"],
               "failed": failed_ids, "next_pending": next_ids, REPEATED: out_ids[REPEATED]}  # fmt: skip
    else:
        summary["exhausted"] = counts.get("max_attempts", 0) + counts.get("error", 0)
        summary["attempts"] = counts.get("attempts", 0)
        accounted = summary["approved"] + summary["exhausted"] + failed_records + out_ids[REPEATED].count
        recompacted_ok = True
        ids = {"planned": planned_ids, "approved": out_ids["approved"], "exhausted": out_ids["rejected"],
               "failed": failed_ids, REPEATED: out_ids[REPEATED]}  # fmt: skip
    # A repeat rejected into rejects/ was read (and digested) by its range's job: it counts as a line.
    digests_ok = planned_ids == out_ids["approved"] + out_ids["rejected"] + failed_ids + out_ids[REPEATED]
    summary["repeated_ids"] = out_ids[REPEATED].count
    named = {k: _named([getattr(d, k) for d in diffs]) for k in ("lost", "doubled", "unexpected")}
    summary["approval_rate"] = round(summary["approved"] / pending_records, 4) if pending_records else None
    summary["ids"] = {k: v.to_dict() for k, v in ids.items()}  # count and digest of each set's ids
    summary["invariant"] = {
        "planned": pending_records,
        "accounted": accounted,
        "ok": accounted == pending_records and recompacted_ok and digests_ok and not any(named.values()),
        **named,
        "opened": [x.shard["shard_id"] for x in settled if x.opened],  # shards whose ids were read
    }
    write_doc(layout.summary(r), summary, so)
    if not summary["invariant"]["ok"]:
        log.error("round %d: %d records planned but %d accounted for; ids lost %s, doubled %s, "
                  "unexpected %s", r, pending_records, accounted, *named.values())  # fmt: skip
    return summary


def _named(lists: list[list[Any]]) -> list[Any]:
    """Ids named by several diffs, once each, at most :data:`MAX_NAMED`."""
    return list(dict.fromkeys(i for ids in lists for i in ids))[:MAX_NAMED]


def _diff(expected: list[JsonlFile], actual: list[JsonlFile], id_field: str) -> IdDiff:
    """The ids that differ between two sets of files, read in bounded memory (:func:`diff_ids`)."""
    return diff_ids(lambda: file_ids(expected, id_field), lambda: file_ids(actual, id_field), limit=MAX_NAMED)


def _settle_range(
    cfg: RunConfig, layout: RunLayout, r: int, x: _Settled, so: StorageOptions | None
) -> _Settled:
    """A round-0 range shard's real records and ids: ``ids["input"]`` and the ``read_*`` counts of
    the job that read the range, or (no job read it to the end: the shard is quarantined) from
    reading the range here, its bad lines to the same ``input-rejects`` file a job writes."""
    shard = x.shard
    if "range" not in shard:
        return x
    sid = shard["shard_id"]
    reader = next((d for d in x.jobs if "read_lines" in (d.get("counts") or {})), None)
    ids = manifest_ids(reader, "input") if reader is not None else None
    if reader is not None and ids is not None:
        stats = {k[len("read_") :]: int(v) for k, v in reader["counts"].items() if k.startswith("read_")}
    else:
        ids = IdDigest()
        with JsonlFile(layout.range_rejects(r, sid), storage_options=so).writer_sync() as rejects:
            rng = read_range(
                shard, id_field=cfg.id_field, assign_ids=cfg.assign_ids, rejects=rejects, storage_options=so
            )
            records = iter(rng)  # one pass: each iter() of a reader reads the range again
            for block in iter(lambda: list(itertools.islice(records, 4096)), []):
                ids.add_many(record_ids(block, rng.check.id_field or cfg.id_field or "id"))
        stats = rng.stats.as_dict()
        x.opened = True
    x.read = stats
    x.shard = {**shard, "records": ids.count, "ids": ids.to_dict()}
    if x.failed is not None:  # its quarantine record accounts for the ids as read
        x.failed.update(records=ids.count, ids=ids.to_dict())
        write_doc(join(layout.failed(r), f"{sid}.json"), x.failed, so)
    return x


REPEATED = "repeated"  # ids digest of the repeats a shard's accepted doc left out (rejects/)


def _range_repeats(cfg: RunConfig, layout: RunLayout, so: StorageOptions | None) -> Repeats:
    """Round 0 over range shards: the later occurrences of ids that an earlier range holds (each
    range's job finds repeats only within its range), from the ranges' id hash files its jobs wrote
    (:mod:`~airflow_batchinfer.storage.id_hashes`); the first occurrence stays, the others are
    rejected (:func:`_drop_repeats`, :func:`_settle_repeats`)."""
    manifest = read_manifest(JsonlDir(layout.input, storage_options=so)) or {}
    ranges = sorted((s for s in manifest.get("shards", []) if "range" in s), key=lambda s: s["range"][0])
    if len(ranges) < 2:
        return Repeats()
    # where every range's job writes it (infer, or infer_judge: the one reading the range)
    repeats = find_repeats(
        ranges, lambda sid: hashes_beside(layout.job_manifest(0, sid, "infer"), sid),
        id_field=manifest.get("id_field") or cfg.id_field, assign_ids=cfg.assign_ids, so=so,
    )  # fmt: skip
    if repeats.count:
        log.warning("round 0: %s holds %d later occurrences of ids an earlier line holds (in other byte "
                    "ranges): each is rejected into %s, the first stays", cfg.input, repeats.count,
                    layout.rejects)  # fmt: skip
    return repeats


def _drop_repeats(
    doc: dict[str, Any], repeats: list[Repeat], id_field: str, rejects: str, so: StorageOptions | None
) -> dict[str, Any]:
    """The accepted doc of a shard holding ``repeats``: its staged approved and rejected files
    rewritten without those rows (beside the originals, atomically: a re-run close rewrites the
    same), its counts, reason groups and id digests less theirs (``ids.repeated``: what was left
    out, ``repeats``: how many and their ``rejects/`` file). An inferred file keeps them: it is what
    the accepted judge read (rewriting it would make that judge stale), and nothing counts it."""
    if not repeats:
        return doc
    drop = {id_bytes(x.id) for x in repeats}
    doc = {**doc, **{k: dict(doc.get(k) or {}) for k in ("counts", "ids", "reason_groups", "committed")}}
    left_out = IdDigest()
    for name in FENCED_OUTPUTS:
        src = doc["committed"].get(name)
        if src is None:  # written in place (no staging): nothing to rewrite before promotion
            raise StorageError(
                f"shard {doc['shard_id']}: {len(repeats)} ids repeated from earlier ranges (first: "
                f"{repeats[0].id!r} at line {repeats[0].line}) but its {name} output was not staged: "
                "delete its job manifest and re-run the DAG run to recompute it"
            )
        dst = src[: -len(SHARD_SUFFIX)] + ".unrepeated" + SHARD_SUFFIX
        gone = _rewrite_without(src, dst, drop, id_field, so)
        for row in gone:
            _uncount(doc, row, name)
        removed = IdDigest.of(row.get(id_field) for row in gone)
        before = IdDigest.maybe(doc["ids"].get(name))
        if before is not None:
            doc["ids"][name] = (before - removed).to_dict()
        doc["committed"][name] = dst
        left_out += removed
    doc["ids"][REPEATED] = left_out.to_dict()
    doc["counts"]["repeated_ids"] = left_out.count
    doc["repeats"] = {"count": left_out.count, "rejects": rejects}
    return doc


def _rewrite_without(
    src: str, dst: str, drop: set[bytes], id_field: str, so: StorageOptions | None
) -> list[dict[str, Any]]:
    """Copy ``src`` to ``dst`` (atomically) without the rows whose id is in ``drop``; returns those."""
    gone: list[dict[str, Any]] = []
    with JsonlFile(dst, storage_options=so).writer_sync() as out:
        for row in JsonlFile(src, storage_options=so).iter_records():
            if id_bytes(row.get(id_field)) in drop:
                gone.append(row)
            else:
                out.write(row)
    return gone


def _uncount(doc: dict[str, Any], row: dict[str, Any], output: str) -> None:
    """Take one left-out row out of the doc's counts (as the job counted it) and reason groups."""
    counts = doc["counts"]
    judgment = row.get("judgment")
    judgment = judgment if isinstance(judgment, dict) else {}
    keys = [str(row.get("status"))]
    if judgment.get("for_review"):
        keys.append("for_review")
    if doc.get("kind") in ("judge", "infer_judge") and row.get("error") is not None:
        keys.append("inference_errors")
    if doc.get("kind") == "infer_judge":  # its inference counts, per row: ok or error
        keys.append("error" if row.get("error") is not None else "ok")
    for key in keys:
        if counts.get(key):
            counts[key] = int(counts[key]) - 1
    groups = doc["reason_groups"]
    if output == "rejected" and groups:
        group = reason_group(row_reason(row))
        key = group if groups.get(group) else OTHER
        if groups.get(key):
            groups[key] = int(groups[key]) - 1
            if not groups[key]:
                del groups[key]


def _settle_repeats(
    layout: RunLayout, r: int, x: _Settled, repeats: list[Repeat], id_field: str, so: StorageOptions | None
) -> None:
    """The rejects of a shard's repeats: ``rejects/<shard>.repeated-ids.jsonl.zst`` (rewritten whole,
    the same each close) once the shard is accepted without them. A quarantined shard holds them in
    its ``failed/`` record (its whole range is retried; they are rejected when it is accepted)."""
    if r != 0 or "range" not in x.shard:
        return
    sid = x.shard["shard_id"]
    uri = rejects_uri(layout.rejects, sid)
    left_out = (x.accepted or {}).get("repeats") or {}
    if x.accepted is not None and left_out.get("count"):
        with JsonlFile(uri, storage_options=so).writer_sync() as out:
            for rep in repeats:
                out.write(rep.reject_row(x.shard["uri"], id_field))
        return
    files.remove(uri, so)  # no accepted doc leaves them out (now): none are rejected
    if not repeats:
        return
    first = f"id {repeats[0].id!r} at line {repeats[0].line} (first at line {repeats[0].first_line})"
    if x.failed is not None:
        x.failed["repeated_ids"] = {
            "count": len(repeats),
            "first": first,
            "note": "rejected into rejects/ once the shard is accepted: the first occurrence stays",
        }
        write_doc(join(layout.failed(r), f"{sid}.json"), x.failed, so)
    elif x.accepted is not None:
        log.error("round 0: shard %s was accepted before repeats were rejected: its %d repeated ids (%s) "
                  "stay in its outputs", sid, len(repeats), first)  # fmt: skip


def _close_input_ranges(layout: RunLayout, settled: list[_Settled], so: StorageOptions | None) -> None:
    """Round 0 over range shards: the run's ``rejects/`` rows get absolute line numbers (each range's
    first line is the sum of the line counts of every range before it), one file per shard with
    bad lines, rewritten whole (a re-run close writes the same); ``input/_manifest.json`` gets the
    input's counts and each shard's records, ids and line counts (``read``) as read. A re-run
    close plans only shards with records, so the line counts of the others come from there."""
    fresh = {x.shard["shard_id"]: {**x.shard, "read": x.read} for x in settled if x.read is not None}
    if not fresh:
        return
    input_dir = JsonlDir(layout.input, storage_options=so)
    manifest = read_manifest(input_dir) or {}
    shards = [fresh.get(s["shard_id"], s) for s in manifest.get("shards", [])]
    totals = dict.fromkeys(("lines", "records", "blank", "skipped", "quarantined"), 0)
    first_line = 0
    for shard in sorted((s for s in shards if "range" in s), key=lambda s: s["range"][0]):
        sid, read = shard["shard_id"], shard.get("read")
        if read is None:  # never read to its end: the lines after it cannot be numbered
            log.error("round 0: range shard %s was never read: rejects after it keep line_in_range only", sid)
            break
        if sid in fresh and read.get("quarantined"):
            rows = JsonlFile(layout.range_rejects(0, sid), storage_options=so).iter_records()
            with JsonlFile(join(layout.rejects, f"{sid}.jsonl.zst"), storage_options=so).writer_sync() as out:
                for row in rows:
                    out.write({**row, "line_no": first_line + int(row["line_in_range"]), "shard_id": sid})
        first_line += read.get("lines", 0)
        for k in totals:
            totals[k] += read.get(k, 0)
    manifest["shards"] = shards
    manifest["counts"] = totals
    write_manifest(input_dir, manifest)


def _account(x: _Settled, id_field: str, so: StorageOptions | None, assign_ids: bool = False) -> _Settled:
    """The id accounting of one settled shard, from digests where they agree.

    The shard's planned digest is its descriptor's ``ids`` (the writer of the pending set recorded
    it), else the digest its first job read (``ids.input``). An accepted shard is consistent when
    that equals the accepted job's approved + rejected digests; otherwise, or with no digests at all
    (a run started before digests existed), its input and final output files are read: their real
    digests are used, and the ids that differ are named. A quarantined shard accounts for its
    planned digest (read from its input file when the plan has none)."""
    shard = x.shard
    planned = IdDigest.maybe(shard.get("ids"))
    if x.counts is None or x.accepted is None:
        if planned is None:
            planned, x.opened = file_digest(JsonlFile(shard["uri"], storage_options=so), id_field), True
        x.planned = planned
        return x
    if planned is None and x.jobs:
        planned = manifest_ids(x.jobs[0], "input")
    left_out = x.accepted.get("repeats")  # repeats rejected into rejects/: lines its job read too
    names = (*FENCED_OUTPUTS, REPEATED) if left_out else FENCED_OUTPUTS
    outputs = {name: manifest_ids(x.accepted, name) for name in names}
    if planned is not None and None not in outputs.values():
        x.planned, x.outputs = planned, {k: v for k, v in outputs.items() if v is not None}
        if planned == sum(x.outputs.values(), IdDigest()):
            return x  # the common case: nothing is read
    sid = shard["shard_id"]
    finals = {name: JsonlFile(x.accepted["outputs"][name], storage_options=so) for name in FENCED_OUTPUTS}
    if left_out:  # its reject rows carry the id
        finals[REPEATED] = JsonlFile(str(left_out["rejects"]), storage_options=so)
    source = JsonlFile(shard["uri"], storage_options=so)

    def source_ids() -> Iterator[Any]:  # a round-0 range: just its range, validated as its job read it
        if "range" in shard:
            return range_ids(shard, id_field=id_field, assign_ids=assign_ids, storage_options=so)
        return file_ids([source], id_field)

    read = IdDigest.of(source_ids()) if "range" in shard else file_digest(source, id_field)
    x.outputs = {name: file_digest(f, id_field) for name, f in finals.items()}
    x.planned, x.opened = planned if planned is not None else read, True
    found = sum(x.outputs.values(), IdDigest())
    if found != x.planned or read != x.planned:
        x.diff = diff_ids(source_ids, lambda: file_ids(list(finals.values()), id_field), limit=MAX_NAMED)
        log.error("shard %s: its outputs do not hold its ids once each: lost %s, doubled %s, unexpected %s",
                  sid, x.diff.lost, x.diff.doubled, x.diff.unexpected)  # fmt: skip
    elif planned is None or outputs != x.outputs:
        log.info("shard %s: ids checked by reading its files (its manifest has no or other digests)", sid)
    return x


def _settle(
    cfg: RunConfig,
    layout: RunLayout,
    r: int,
    shard: ShardDescriptor,
    kinds: tuple[JobKind, ...],
    already_failed: set[str],
    engines: dict[str, dict[str, Any] | None],
    so: StorageOptions | None,
    repeats: list[Repeat] | None = None,
) -> _Settled:
    """Check one shard's jobs against the current settings (and ``engines``, what the round's
    pools run per job kind, where the plan recorded it), then accept them once (promoting the
    accepted attempts' staged outputs: the accounting job's, and the infer attempt its judge read)
    or quarantine the shard. Every decision is a compare-and-swap of the accounting job's accepted
    doc from what this close read (:func:`_claim`): of two closes at once, the one that loses adopts
    the decision that stands, never its own. A quarantine another close is still sweeping is never
    replaced: this close waits for its end (:func:`_await_sweep`), then settles from it."""
    uri = layout.accepted(r, shard["shard_id"], kinds[-1])
    stale: dict[str, Any] | None = None  # a sweep whose close is taken for gone: may be replaced
    repeated = repeats or []
    for _ in range(CLAIM_TRIES):
        settled = _settle_once(cfg, layout, r, shard, kinds, already_failed, engines, so, repeated, stale)
        if isinstance(settled, _Settled):
            return settled
        stale = _await_sweep(uri, settled.doc, so) if isinstance(settled, _Sweeping) else None
    raise StorageError(
        f"round {r}: shard {shard['shard_id']}: {CLAIM_TRIES} closes at once kept deciding {uri} "
        "differently; run only one close of the round at a time, then re-run it"
    )


CLAIM_TRIES = 3  # settles of one shard when concurrent closes keep changing its decision
SWEEPING, SWEPT = "sweeping", "swept"  # a quarantine doc's ``sweep``: its close's steps running, done
SWEEP_WAIT_S = 60.0  # after a quarantine is decided, how long its sweep is waited for before a close
SWEEP_POLL_S = 0.2  # takes its close for gone (a sweep is a few deletes); how often it is re-read


@dataclass(frozen=True)
class _Sweeping:
    """Another close's quarantine of the shard, still sweeping: wait for it, then settle again."""

    doc: dict[str, Any]


def _sweeping(doc: dict[str, Any] | None) -> bool:
    return bool(doc and doc.get("quarantined") and doc.get("sweep") == SWEEPING)


def _await_sweep(uri: str, doc: dict[str, Any], so: StorageOptions | None) -> dict[str, Any] | None:
    """Wait until the sweeping quarantine ``doc`` at ``uri`` changes: ``None`` then (settle again from
    what stands). ``doc`` itself when it has not :data:`SWEEP_WAIT_S` after it was decided: its close
    is taken for gone (cut short) and this one may replace it; should that close still run, it stops
    at its next step, finding the doc no longer its own (:func:`_sweep_quarantined`)."""
    deadline = min(float(doc.get("quarantined_at") or 0.0), time.time()) + SWEEP_WAIT_S
    while time.time() < deadline:
        time.sleep(SWEEP_POLL_S)
        if read_doc(uri, "accepted job", so) != doc:
            return None
    log.warning("%s: the close that quarantined its shard at %s did not finish sweeping it in %.0f s: "
                "taking it for gone, this close decides again", uri, doc.get("quarantined_at"),
                SWEEP_WAIT_S)  # fmt: skip
    return doc


@dataclass
class _Checked:
    """One job of a shard as close finds it."""

    kind: str
    manifest: dict[str, Any] | None
    seen: dict[str, Any] | None  # its accepted doc as read (quarantined or stale too): claims swap from it
    manifest_current: bool = False
    doc: dict[str, Any] | None = None  # what counts: ``seen`` (accepted earlier) or ``manifest``
    problem: str | None = None  # why neither is current

    @property
    def kept(self) -> bool:
        return self.doc is not None and self.doc is self.seen


def _settle_once(
    cfg: RunConfig,
    layout: RunLayout,
    r: int,
    shard: ShardDescriptor,
    kinds: tuple[JobKind, ...],
    already_failed: set[str],
    engines: dict[str, dict[str, Any] | None],
    so: StorageOptions | None,
    repeats: list[Repeat],
    stale: dict[str, Any] | None,
) -> _Settled | _Sweeping | None:
    """One try of :func:`_settle`; ``None`` when another close changed the decision while this one
    made its own (settled again then, from what that close decided); :class:`_Sweeping` when another
    close's quarantine is still sweeping (but ``stale``, one taken for gone)."""
    sid = shard["shard_id"]
    acct = kinds[-1]
    final = job_spec(cfg, acct, r, shard).outputs  # the outputs' final URIs (they do not depend on input)
    accepted_uri = layout.accepted(r, sid, acct)
    checked: list[_Checked] = []
    for kind in kinds:
        checked.append(_check_job(cfg, layout, r, shard, kind, engines.get(kind), so))
        if checked[-1].problem is not None:
            break
    last = checked[-1]
    seen = last.seen if last.kind == acct else read_doc(accepted_uri, "accepted job", so)
    if _sweeping(seen) and seen != stale:  # no decision replaces it: its sweep could remove what it moves
        assert seen is not None
        return _Sweeping(seen)
    replaces_quarantine = bool(seen and seen.get("quarantined"))  # its failed/ record goes if accepted
    problem = None if last.problem is None else (last.kind, last.problem)
    rerun = False  # a current manifest is unusable: delete it so a re-run recomputes
    stood: dict[str, Any] | None = None  # the accounting job's accepted doc (earlier, or now)
    if problem is None and last.kept:
        stood = last.doc  # accepted earlier for these settings: a later copy never replaces it
    elif problem is None:
        assert last.doc is not None
        committed = (last.doc.get("committed") or {}).values()
        missing = [u for u in committed if not files.exists(u, so)]
        if missing:
            problem = (acct, f"the staged outputs of attempt {last.doc.get('attempt')} are missing "
                             f"({', '.join(missing)}): re-run the DAG run to recompute them")  # fmt: skip
            rerun = True
        else:  # first the decision, then the moves (redone if cut short)
            mine = _accepted_doc(last.doc, sid, acct, final, layout.job_manifest(r, sid, acct), so)
            # ids an earlier range holds are left out of what is accepted (rejects/: _settle_repeats)
            mine = _drop_repeats(mine, repeats, cfg.id_field or "id", rejects_uri(layout.rejects, sid), so)
            stood, won = _claim(accepted_uri, seen, mine, so)
            replaces_quarantine = replaces_quarantine and won
            seen = stood
            _log_claim(r, sid, stood, won, mine)
    if stood is not None and _sweeping(stood):  # another close quarantined it meanwhile, still sweeping
        return _Sweeping(stood)
    if stood is not None and stood.get("quarantined"):  # another close quarantined it meanwhile
        return _adopt_quarantine(layout, r, shard, stood, checked, so)
    if stood is not None:
        jobs, problem = _accept_feeds(layout, r, shard, checked[:-1], stood, so)
        lost = [u for doc in [*jobs, stood] for u in _promote(doc, so)] if problem is None else []
        if lost:
            problem = (acct, f"the accepted outputs {', '.join(lost)} of attempt {stood.get('attempt')} are "
                             "missing: re-run the DAG run to recompute them")  # fmt: skip
            rerun = True
        if problem is None:
            for kind in kinds:  # other copies' attempts: never promoted
                files.remove_tree(layout.staged_job(r, sid, kind), so)
            # quarantined by an earlier close (or by one during this one); its job has finished since
            if f"{sid}.json" in already_failed or replaces_quarantine:
                files.remove(join(layout.failed(r), f"{sid}.json"), so)
                log.info("round %d: shard %s accepted: its quarantine record is removed", r, sid)
            return _Settled(shard, [*jobs, stood], dict(stood.get("counts") or {}), accepted=stood)
    assert problem is not None
    return _quarantine_shard(layout, r, shard, kinds, checked, problem, rerun, seen, final, so)


def _check_job(
    cfg: RunConfig,
    layout: RunLayout,
    r: int,
    shard: ShardDescriptor,
    kind: JobKind,
    engine: dict[str, Any] | None,
    so: StorageOptions | None,
) -> _Checked:
    """One job's accepted doc and manifest, each checked against the current settings."""
    sid = shard["shard_id"]
    manifest_uri = layout.job_manifest(r, sid, kind)
    m = read_job_manifest(manifest_uri, so)
    seen = read_doc(layout.accepted(r, sid, kind), "accepted job", so)
    prior = seen if seen is not None and not seen.get("quarantined") else None
    x = _Checked(kind, m, seen, manifest_current=_current(cfg, layout, r, shard, kind, m, engine, so))
    if _current(cfg, layout, r, shard, kind, prior, engine, so):
        x.doc = prior
    elif x.manifest_current:
        x.doc = m
    else:
        note = read_doc(layout.job_error(r, sid, kind), "job error", so)
        error = (note or {}).get("error")
        if m is None:
            x.problem = error or "the job never completed (no completion manifest)"
        else:
            x.problem = STALE.format(uri=manifest_uri) + (f"; last error: {error}" if error else "")
    return x


def _current(
    cfg: RunConfig,
    layout: RunLayout,
    r: int,
    shard: ShardDescriptor,
    kind: JobKind,
    doc: dict[str, Any] | None,
    engine: dict[str, Any] | None,
    so: StorageOptions | None,
) -> bool:
    """Whether ``doc`` (a manifest or an accepted doc) is the job the current settings ask for: its job
    id and fingerprint recomputed from its input's version. A judge's input is the inferred file its
    doc names, when that is this shard's (see :func:`_judge_read`)."""
    if doc is None:
        return False
    src = shard
    if kind == "judge":
        read = _judge_read(layout, r, shard["shard_id"], doc)
        if read is None:
            return False
        src = {**inferred_shard(cfg, r, shard), "uri": read}
    spec = job_spec(cfg, kind, r, src)
    info = _input_info(spec.input, so)
    if info is None and kind == "judge" and "accepted_at" in doc:
        info = doc.get("input_info")  # the infer attempt it read, moved to inferred/ since
    if info is None:
        return False
    pinned = pin_input(spec, info)
    return (
        doc.get("job_id") == pinned.job_id
        and (engine is None or doc.get("engine") == engine)
        and doc.get("fingerprint") == fingerprint(pinned, doc.get("engine") or {}, info)
    )


def _judge_read(layout: RunLayout, r: int, sid: str, doc: dict[str, Any]) -> str | None:
    """The inferred file a judge's manifest or accepted doc says the judge read, when it is this
    shard's: the final ``inferred/`` file, or one attempt its infer job staged."""
    final = layout.inferred(r, sid)
    read = str(doc.get("input") or final)  # an accepted doc from before inputs were recorded: the final
    ours = read == final or staged_attempt(layout.staged_job(r, sid, "infer"), read, INFERRED) is not None
    return read if ours else None


def _accept_feeds(
    layout: RunLayout,
    r: int,
    shard: ShardDescriptor,
    feeds: list[_Checked],
    stood: dict[str, Any],
    so: StorageOptions | None,
) -> tuple[list[dict[str, Any]], tuple[str, str] | None]:
    """Accept the jobs before the accounting one (an infer job before its judge): the attempt the
    accepted judge read, whatever a later copy wrote since, claimed once as the judge's doc is."""
    sid = shard["shard_id"]
    docs: list[dict[str, Any]] = []
    for x in feeds:
        assert x.doc is not None
        final = layout.inferred(r, sid)
        read = _judge_read(layout, r, sid, stood)
        attempt = (x.doc.get("committed") or {}).get(INFERRED) or final
        if x.kept and read not in (final, attempt):
            return docs, (x.kind, f"its judge read {read}, not the attempt {x.doc.get('attempt')} of "
                                  f"{layout.job_manifest(r, sid, x.kind)} close accepted earlier: re-run the "
                                  "DAG run to recompute the judge")  # fmt: skip
        if x.kept:
            docs.append(x.doc)
            continue
        if read is None:  # validated when it was accepted: a doc edited by hand since
            return docs, (x.kind, f"{layout.accepted(r, sid, 'judge')} names an input that is not this "
                                  "shard's inferred file: delete it and re-run the DAG run")  # fmt: skip
        mine = _accepted_doc(x.doc, sid, x.kind, {INFERRED: final}, layout.job_manifest(r, sid, x.kind), so)
        token = staged_attempt(layout.staged_job(r, sid, x.kind), read, INFERRED)
        if token is None:  # the judge read the final file: written in place, or promoted earlier
            mine["committed"] = {}
        elif token != mine["attempt"]:  # a later copy rewrote the manifest: the judge's read stands
            mine.update(attempt=token, committed={INFERRED: read}, manifest_attempt=mine["attempt"])
        doc, won = _claim(layout.accepted(r, sid, x.kind), x.seen, mine, so)
        _log_claim(r, sid, doc, won, mine)
        docs.append(doc)
    return docs, None


def _quarantine_shard(
    layout: RunLayout,
    r: int,
    shard: ShardDescriptor,
    kinds: tuple[JobKind, ...],
    checked: list[_Checked],
    problem: tuple[str, str],
    rerun: bool,
    seen: dict[str, Any] | None,
    final: dict[str, str],
    so: StorageOptions | None,
) -> _Settled | _Sweeping | None:
    """Quarantine the shard in two steps of its accepted doc: ``sweep: sweeping`` once the decision
    stands, then delete the unusable manifest (``rerun``), sweep its staged attempts but those a
    current manifest names (a later close accepts them), remove final outputs no accepted job
    produced and write its ``failed/`` record; then ``sweep: swept``. No other close replaces a
    sweeping doc (it waits, :func:`_settle`), so nothing accepted meanwhile is removed. ``None`` when
    another close accepted it first, or took this sweep over (settled again then)."""
    sid, acct = shard["shard_id"], kinds[-1]
    phase, error = problem
    uri = layout.accepted(r, sid, acct)
    mine = {"shard_id": sid, "kind": acct, "quarantined": True, "sweep": SWEEPING, "phase": phase,
            "error": error, "quarantined_at": time.time()}  # fmt: skip
    stood, won = _claim(uri, seen, mine, so)
    if not stood.get("quarantined"):
        return None
    if not won and _sweeping(stood):  # another close's quarantine, still sweeping: wait for it
        return _Sweeping(stood)
    if not won:  # another close's quarantine: it swept and removed
        return _adopt_quarantine(layout, r, shard, stood, checked, so)
    orphans = _sweep_quarantined(layout, r, shard, kinds, checked, rerun, final, stood, so)
    if orphans is not None:
        record = _quarantine(layout, r, shard, phase, error, orphans, so)
        if _claim(uri, stood, {**mine, "sweep": SWEPT, "orphans_removed": orphans}, so)[1]:
            return _Settled(shard, _feed_docs(checked, acct), None, record, orphans)
    log.warning("round %d: shard %s: another close took over its quarantine: settling it again", r, sid)
    return None


def _still(uri: str, doc: dict[str, Any], so: StorageOptions | None) -> Callable[[], bool]:
    """Whether ``doc`` is still the decision at ``uri``: read again before each destructive step."""
    return lambda: read_doc(uri, "accepted job", so) == doc


def _sweep_quarantined(
    layout: RunLayout,
    r: int,
    shard: ShardDescriptor,
    kinds: tuple[JobKind, ...],
    checked: list[_Checked],
    rerun: bool,
    final: dict[str, str],
    doc: dict[str, Any],
    so: StorageOptions | None,
) -> list[str] | None:
    """The destructive steps of a quarantine, each once this close's sweeping ``doc`` is read back
    as the decision; returns the orphans removed, or ``None`` when it no longer stands (a close that
    took this one for gone decided since: what that close accepted is never removed)."""
    sid, acct = shard["shard_id"], kinds[-1]
    still = _still(layout.accepted(r, sid, acct), doc, so)
    # a re-run recomputes the accounting job, and a job before it whose attempt is gone
    removed = {
        x.kind for x in checked if x.manifest is not None and rerun and (x.kind == acct or _lost(x, so))
    }
    for kind in removed:
        if not still():
            return None
        files.remove(layout.job_manifest(r, sid, kind), so)
    keep = {
        posixpath.dirname(u)
        for x in checked
        if x.manifest_current and x.manifest is not None and x.kind not in removed
        for u in (x.manifest.get("committed") or {}).values()
    }
    swept = _sweep_staged(layout, r, sid, kinds, keep, still, so)
    if swept is None:
        return None
    if swept:
        log.info("round %d: shard %s is quarantined: swept staged attempts %s", r, sid, ", ".join(swept))
    orphans = [final[name] for name in FENCED_OUTPUTS if files.exists(final[name], so)]
    for uri in orphans:
        if not still():
            return None
        files.remove(uri, so)
    if orphans:
        log.warning("round %d: shard %s is quarantined: removed outputs no accepted job produced: %s",
                    r, sid, ", ".join(orphans))  # fmt: skip
    return orphans if still() else None  # its failed/ record is written next


def _adopt_quarantine(
    layout: RunLayout,
    r: int,
    shard: ShardDescriptor,
    stood: dict[str, Any],
    checked: list[_Checked],
    so: StorageOptions | None,
) -> _Settled:
    """The quarantine another close decided, as it recorded it (that close removes what it named)."""
    orphans = list(stood.get("orphans_removed") or [])
    record = _quarantine(layout, r, shard, str(stood.get("phase")), str(stood.get("error")), orphans, so)
    return _Settled(shard, _feed_docs(checked, str(stood.get("kind"))), None, record, orphans)


def _feed_docs(checked: list[_Checked], acct: str) -> list[dict[str, Any]]:
    """The current docs of a quarantined shard's jobs before the accounting one (their figures count)."""
    return [x.doc for x in checked if x.doc is not None and x.kind != acct]


def _sweep_staged(
    layout: RunLayout,
    r: int,
    sid: str,
    kinds: Iterable[str],
    keep: set[str],
    still: Callable[[], bool],
    so: StorageOptions | None,
) -> list[str] | None:
    """Remove a quarantined shard's staged attempts but those in ``keep`` (attempt folders), each
    once ``still()``; returns the folders removed (``None``: stopped, the quarantine no longer
    stands). A copy still writing into one fails, and its task's retry runs it anew."""
    swept = []
    for kind in kinds:
        job_dir = layout.staged_job(r, sid, kind)
        for token in files.names(job_dir, so):
            attempt = join(job_dir, token)
            if attempt not in keep:
                if not still():
                    return None
                files.remove_tree(attempt, so)
                swept.append(attempt)
    return swept


def _lost(x: _Checked, so: StorageOptions | None) -> bool:
    """Whether a job's manifest names staged files that are gone (and were not promoted by close)."""
    committed = ((x.manifest or {}).get("committed") or {}).values()
    return not x.kept and any(not files.exists(u, so) for u in committed)


def _claim(
    uri: str, seen: dict[str, Any] | None, doc: dict[str, Any], so: StorageOptions | None
) -> tuple[dict[str, Any], bool]:
    """Write the decision ``doc`` at ``uri`` unless another close changed it since this one read
    ``seen`` (one compare-and-swap, :func:`airflow_batchinfer.storage.swap.update`: a lock on a local
    disk, ``If-None-Match``/``If-Match`` on S3). Returns the decision that stands (with its
    ``schema_version``) and whether it is ``doc``."""
    loc = resolve(uri, so)
    mine = encode_json(doc, schema_version=DOC_VERSION)

    def change(current: bytes | None) -> bytes:
        if current is not None and _parse_doc(loc, current) != seen:
            return current  # decided by another close after this one read it: that stands
        return mine

    data = swap.update(loc, change)
    return _parse_doc(loc, data), data == mine


def _parse_doc(loc: Location, raw: bytes) -> dict[str, Any]:
    return parse_json(loc, raw, schema_version=DOC_VERSION, what="accepted job",
                      remedy="delete it to redo that step")  # fmt: skip


def _log_claim(r: int, sid: str, stood: dict[str, Any], won: bool, mine: dict[str, Any]) -> None:
    what = f"attempt {stood.get('attempt')} of {stood.get('job_id')} ({stood.get('kind')})"
    if won:
        log.info("round %d: shard %s: accepted %s", r, sid, what)
    else:
        log.warning("round %d: shard %s: another close of the round decided first; accepting its %s, not "
                    "attempt %s", r, sid, what, mine.get("attempt"))  # fmt: skip


def _accepted_doc(
    m: dict[str, Any],
    sid: str,
    kind: str,
    final: dict[str, str],
    manifest_uri: str,
    so: StorageOptions | None,
) -> dict[str, Any]:
    """What close accepts of a job: its attempt, the staged files to move, the counts to use and the
    version of the input it read (a judge's, an infer attempt, is moved to inferred/ after)."""
    info = _input_info(str(m.get("input")), so) if m.get("input") else None
    return {
        "shard_id": sid,
        "kind": kind,
        "quarantined": False,
        "job_id": m.get("job_id"),
        "fingerprint": m.get("fingerprint"),
        "attempt": m.get("attempt"),
        "committed": dict(m.get("committed") or {}),  # name -> staged URI (none: written in place)
        "outputs": {name: final[name] for name in fenced_outputs(kind)},
        "manifest": manifest_uri,
        "input": m.get("input"),
        "input_info": {k: info[k] for k in ("size", "ETag", "mtime") if k in info} if info else None,
        **{k: m.get(k) for k in ACCEPTED_FIELDS},
        "accepted_at": time.time(),
    }


def _promote(doc: dict[str, Any], so: StorageOptions | None) -> list[str]:
    """Move the accepted attempt's staged outputs to their final URIs. Idempotent: an output whose
    staged file is gone was moved by an earlier close, or by another close at once (a job without
    staging wrote it in place). Returns the outputs found nowhere."""
    lost = []
    committed = doc.get("committed") or {}
    for name, dst in doc["outputs"].items():
        staged = committed.get(name)
        if staged and files.exists(staged, so):
            with contextlib.suppress(FileNotFoundError):  # moved by a concurrent close just now
                files.move(staged, dst, so)
        if not files.exists(dst, so):
            lost.append(dst)
    return lost


def _remove_unplanned(layout: RunLayout, r: int, plan: Plan, so: StorageOptions | None) -> list[str]:
    """Final outputs of this round for shards the plan does not name (an earlier plan's): orphans that
    would break the count check and the recompaction."""
    planned = {s["shard_id"] for s in plan.shards}
    prefix = f"round{r:02d}-" if plan.mode == "rounds" else "tail-"
    found = [join(layout.rejected_dir(r), n) for n in files.names(layout.rejected_dir(r), so)
             if n.endswith(SHARD_SUFFIX) and n[: -len(SHARD_SUFFIX)] not in planned]  # fmt: skip
    found += [join(layout.results, n) for n in files.names(layout.results, so)
              if n.startswith(prefix) and n.endswith(SHARD_SUFFIX)
              and n[len(prefix) : -len(SHARD_SUFFIX)] not in planned]  # fmt: skip
    removed = [u for u in found if files.remove(u, so)]
    if removed:
        log.warning("round %d: removed outputs of shards the plan does not name: %s", r, ", ".join(removed))
    return removed


def _quarantine(
    layout: RunLayout,
    r: int,
    shard: ShardDescriptor,
    phase: str,
    error: str,
    orphans: list[str],
    so: StorageOptions | None,
) -> dict[str, Any]:
    """A shard whose ``phase`` job exhausted its retries: its whole input is recorded in ``failed/``."""
    sid = shard["shard_id"]
    if orphans:
        error += f" (removed outputs no accepted job produced: {', '.join(orphans)})"
    record = {
        "shard_id": sid,
        "uri": shard["uri"],
        "records": shard["records"],
        "round": r,
        "phase": phase,
        "error": error,
        "orphans_removed": orphans,
        "remedy": "fix the cause, then re-run the DAG run (finished shards are not run again)",
    }
    if "range" in shard:  # round 0 read in place: the shard is these bytes of the source
        record["range"] = shard["range"]
    if "ids" in shard:
        record["ids"] = shard["ids"]  # what the quarantined shard accounts for
    write_doc(join(layout.failed(r), f"{sid}.json"), record, so)
    log.error("round %d: shard %s quarantined (%s): %s", r, sid, phase, record["error"])
    return record


# ------------------------------------------------------------------------------------- storage
def _input_info(uri: str, so: StorageOptions | None) -> dict[str, Any] | None:
    try:
        return JsonlFile(uri, storage_options=so).info()
    except FileNotFoundError:
        return None
