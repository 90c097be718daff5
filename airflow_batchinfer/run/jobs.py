"""The jobs a round runs: their kinds per round mode, the settings a shard's round runs, each shard's
job spec (job id, input, outputs, params), what a judge reads, and a job's last error kept for close."""

from __future__ import annotations

from airflow_batchinfer.judges.spot_check import SpotCheck
from airflow_batchinfer.rpc.fingerprint import spec_key
from airflow_batchinfer.rpc.models import JobKind, JobSpec
from airflow_batchinfer.run.prepare import run_key
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import (
    AcceptedJob,
    JobError,
    Mode,
    read_accepted,
    read_job_manifest,
    write_job_error,
)
from airflow_batchinfer.state.layout import INFERRED, RunLayout
from airflow_batchinfer.state.params import JobParams
from airflow_batchinfer.state.shards import PlannedShard
from airflow_batchinfer.storage.location import StorageOptions
from airflow_batchinfer.storage.ranges import range_params
from airflow_batchinfer.storage.shard_ref import ShardRef


def round_kinds(cfg: RunConfig, mode: Mode) -> tuple[JobKind, ...]:
    """The jobs a round of ``mode`` runs per shard, in order; the last one's outputs are accepted.
    A judge on the run's pool is fused with inference (the shard is read once, no inferred file);
    a judge with its own pool (``judge_pool``) runs after inference, shard by shard."""
    if mode == "in_place":
        return ("in_place",)
    return ("infer", "judge") if cfg.judging.judge_pool else ("infer_judge",)


def job_spec(cfg: RunConfig, kind: JobKind, r: int, shard: PlannedShard) -> JobSpec:
    """The job a round runs for one shard (``shard.uri`` is the job's input). Every kind carries
    ``outputs["staging"]``: the worker writes its outputs (approved and rejected rows; an infer job's
    inferred rows) under an attempt token there, and
    :func:`~airflow_batchinfer.run.close.close_round` moves one attempt's files to the final URIs. A
    judge's input is :func:`judge_input`. A shard with a ``spot_check_rate`` (its plan's) gives its
    judge ``params.spot_check``: that rate and the run's seed (:func:`run_key`)."""
    layout = RunLayout.of(cfg.run_root, cfg.data.output_format)  # results and rejected in its format
    sid = shard.shard_id
    params: JobParams
    if kind == "infer":
        outputs = {
            "inferred": layout.inferred(r, sid),
            "manifest": layout.job_manifest(r, sid, kind),
            "staging": layout.staging(r),  # fenced: a late copy never rewrites what a judge read
            "segments": layout.segments(r, sid, kind),  # committed chunks: a retry resumes after them
        }
        params = cfg.infer_params()
    elif kind in ("judge", "infer_judge"):
        outputs = {
            "approved": layout.result(r, sid),
            "rejected": layout.rejected(r, sid),
            "manifest": layout.job_manifest(r, sid, kind),
            "staging": layout.staging(r),  # fenced: close accepts one attempt's outputs, once
            "segments": layout.segments(r, sid, kind),  # committed chunks: a retry resumes after them
        }
        params = cfg.judge_params() if kind == "judge" else cfg.infer_params().merge(cfg.judge_params())
        rate = shard.spot_check_rate
        if rate:
            params = params.model_copy(update={"spot_check": SpotCheck(rate, run_key(cfg.run_root)).params()})
    else:
        outputs = {
            "approved": layout.result(r, sid, tail=True),
            "rejected": layout.rejected(r, sid),
            "checkpoints": layout.checkpoints(r, sid),
            "manifest": layout.job_manifest(r, sid, kind),
            "staging": layout.staging(r),
        }
        params = cfg.in_place_params()
    # a round-0 range shard: the job reads and validates just that range, its bad lines to input_rejects
    in_range = range_params(shard.ref, id_field=cfg.data.id_field, assign_ids=cfg.data.assign_ids)
    if in_range:
        outputs["input_rejects"] = layout.range_rejects(r, sid)
    params = params.model_copy(update={"round": r, "input_records": shard.records, **in_range})
    spec = JobSpec(job_id="x", kind=kind, input=shard.uri, outputs=outputs, params=params.wire())
    # The id names the run, the shard and what is asked: resubmitting it is idempotent, and a changed
    # request (other settings) is a new job rather than a conflict with a remembered one.
    spec.job_id = f"{run_key(cfg.run_root)}-r{r:02d}-{sid}-{kind}-{spec_key(spec)}"
    return spec


def inferred_shard(cfg: RunConfig, r: int, shard: PlannedShard) -> PlannedShard:
    """A shard the round inferred (its final ``inferred/`` file): what the judge task is mapped
    over, with the spot check rate its plan asked (the judge job holds that back). The judge job
    itself reads :func:`judge_input`."""
    sid = shard.shard_id
    ref = ShardRef(shard_id=sid, uri=RunLayout(cfg.run_root).inferred(r, sid), records=shard.records)
    return PlannedShard(ref=ref, spot_check_rate=shard.spot_check_rate)


def judge_input(
    cfg: RunConfig, r: int, shard: PlannedShard, so: StorageOptions | None = None
) -> PlannedShard:
    """What a judge submitted now reads: the infer attempt the infer manifest names (a late copy of
    the infer job writes an attempt of its own, never this one), or the final ``inferred/`` file
    once close accepted that job (its attempt promoted there) or for an infer job that wrote it in
    place. Close accepts the infer attempt the accepted judge read (its manifest's ``input``)."""
    layout = RunLayout(cfg.run_root)
    desc = inferred_shard(cfg, r, shard)
    m = read_job_manifest(layout.job_manifest(r, shard.shard_id, "infer"), so)
    staged = (m.committed or {}).get(INFERRED) if m is not None else None
    if m is None or not staged:
        return desc
    acc = read_accepted(layout.accepted(r, shard.shard_id, "infer"), so)
    if isinstance(acc, AcceptedJob) and (acc.job_id, acc.fingerprint) == (m.job_id, m.fingerprint):
        return desc  # accepted: its attempt is in inferred/, whatever a later copy staged since
    return desc.with_ref(desc.ref.model_copy(update={"uri": staged}))


def record_job_error(
    cfg: RunConfig, r: int, shard_id: str, kind: str, error: str, storage_options: StorageOptions | None
) -> None:
    """Keep the last error of a shard's job next to its manifest: ``close`` quotes it when it
    quarantines the shard."""
    uri = RunLayout(cfg.run_root).job_error(r, shard_id, kind)
    write_job_error(uri, JobError(shard_id=shard_id, kind=kind, error=error), storage_options)
