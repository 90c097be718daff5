"""Pre-flight: a small sample through infer and judge on the warm pool before the fan-out, and what
it projects for the whole run (tokens/s, approval rate, wall time and GPU-hours over the expected
rounds), so a run that would blow its budget stops before it spends it."""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import itertools
import time
from collections.abc import Iterable
from typing import Any

import httpx

from airflow_batchinfer.engines.base import SamplingParams
from airflow_batchinfer.engines.budget import THINKING_BUDGET, thinking_warnings
from airflow_batchinfer.engines.sampling import completion_tokens
from airflow_batchinfer.exceptions import ConfigError, RpcError
from airflow_batchinfer.prompts.retries import reads_previous
from airflow_batchinfer.rpc.fingerprint import spec_key
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.rpc.pool import PoolClient
from airflow_batchinfer.run import sizing
from airflow_batchinfer.run.jobs import round_kinds
from airflow_batchinfer.run.plan import pending_shards
from airflow_batchinfer.run.prepare import run_key
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import JobManifest
from airflow_batchinfer.state.docs.preflight import PreflightSummary, write_preflight
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.state.params import JobParams
from airflow_batchinfer.storage import JsonlFile
from airflow_batchinfer.storage.location import StorageOptions, join
from airflow_batchinfer.storage.ranges import DiscardRejects, read_range
from airflow_batchinfer.storage.shard_ref import RangeRef, ShardRef


def _spec(
    cfg: RunConfig, kind: str, source: str, outputs: dict[str, str], params: JobParams, *, records: int
) -> JobSpec:
    """A pre-flight job on ``records`` sample records; its manifest is ``preflight/<kind>.json``."""
    outputs = {**outputs, "manifest": join(RunLayout(cfg.run_root).preflight, f"{kind}.json")}
    wire = params.model_copy(update={"input_records": records}).wire()
    spec = JobSpec(job_id="x", kind=kind, input=source, outputs=outputs, params=wire)  # type: ignore[arg-type]
    spec.job_id = f"{run_key(cfg.run_root)}-preflight-{kind}-{spec_key(spec)}"
    return spec


async def _slots(pool: PoolClient) -> list[int]:
    """Each answering worker's job slots (its ``--concurrency``), from ``/v1/stats``."""
    out = []
    for client in pool.clients.values():
        try:
            out.append((await client.stats()).slots_total)
        except RpcError:
            continue
    return out


def expected_passes(approval: float, cfg: RunConfig) -> float:
    """Records processed per input record: every round (or in-place attempt) re-runs the share the
    judge rejected, assuming attempts succeed independently at the sample's approval rate
    (:func:`airflow_batchinfer.run.sizing.expected_passes` with the run's settings)."""
    return sizing.expected_passes(
        approval, cfg.retries.strategy, cfg.retries.max_rounds, cfg.retries.max_attempts
    )


def _sizing(
    cfg: RunConfig,
    records: int,
    workers: int,
    concurrency: int | None,
    tokens_per_s: float,
    tokens_per_record: float,
    approval: float,
    max_map_length: int,
    shard_sizes: list[int] | None = None,
) -> dict[str, Any]:
    """The sizing plan for the whole run from the measured rates, or ``{"error": why}``: the run's
    shard size (round 0's shards as planned: ``shard_sizes``), lanes (the run setting; 0 or none:
    one per pool slot) and ``chunk_size`` (what a lost worker redoes per job), the default straggler
    (the plan errs long)."""
    if concurrency is None:
        return {"error": "no worker answered /v1/stats: its concurrency (job slots) is unknown"}
    try:
        plan = sizing.plan_run(
            records,
            workers,
            tokens_per_s,
            concurrency=concurrency,
            tokens_per_record=tokens_per_record,
            max_map_length=max_map_length,
            lanes=cfg.sharding.lanes,
            chunk_size=cfg.sharding.chunk_size,
            records_per_shard=cfg.sharding.records_per_shard,
            shard_sizes=shard_sizes,
            approval_rate=approval,
            max_rounds=cfg.retries.max_rounds,
            strategy=cfg.retries.strategy,
            max_attempts=cfg.retries.max_attempts,
        )
    except ConfigError as exc:
        return {"error": str(exc)}
    return plan.to_dict()


SAMPLE_SPREAD = 8  # shards the pre-flight sample is drawn from, spread over the input


def sample_plan(counts: list[int], wanted: int, spread: int = SAMPLE_SPREAD) -> list[tuple[int, int]]:
    """Where the pre-flight sample comes from: ``(shard index, its first rows to take)``, from up to
    ``spread`` shards spread evenly over the input (a file sorted by length or by task is sampled
    across, not from its start), each taking an equal share; a share a shard cannot fill goes to the
    next, and what the spread shards cannot fill comes from the others in order. ``counts``: each
    shard's records (as planned: a range shard's estimate); spread by records, not by shard index
    (round 0's last shards are smaller: :mod:`~airflow_batchinfer.storage.taper`)."""
    if not counts:
        return []
    k = max(1, min(len(counts), spread, wanted))
    starts = list(itertools.accumulate(counts, initial=0))  # each shard's first record
    picks = sorted({min(bisect.bisect_right(starts, i * starts[-1] // k), len(counts)) - 1 for i in range(k)})
    taken = [0] * len(counts)
    left = wanted
    for j, i in enumerate(picks):
        taken[i] = min(counts[i], -(-left // (len(picks) - j)))
        left -= taken[i]
    for i, count in enumerate(counts):
        more = max(0, min(count - taken[i], left))
        taken[i], left = taken[i] + more, left - more
    return [(i, n) for i, n in enumerate(taken) if n > 0]


def _records(
    cfg: RunConfig, shard: ShardRef | RangeRef, so: StorageOptions | None
) -> Iterable[dict[str, Any]]:
    """A pending shard's records; a round-0 byte range is read and validated as its job reads it
    (bad lines are skipped here: its job quarantines them)."""
    if not isinstance(shard, RangeRef):
        return JsonlFile(shard.uri, storage_options=so).iter_records()
    return read_range(
        shard,
        id_field=cfg.data.id_field,
        assign_ids=cfg.data.assign_ids,
        rejects=DiscardRejects(),
        storage_options=so,
    )


def _greedy(sampling: SamplingParams) -> bool:
    """Whether ``sampling`` picks the likeliest token every time (whatever its seed)."""
    return sampling.temperature == 0 or sampling.top_k == 1


def same_retries(cfg: RunConfig) -> str | None:
    """Why every retry of ``cfg``'s samples would produce the text the attempt before it did
    (``None``: retries can differ, or there are none): sampling is greedy (temperature 0: a seed,
    which :func:`~airflow_batchinfer.prompts.retries.attempt_seed` varies per attempt, changes nothing), no
    ``retry_sampling`` entry changes more than the seed or ``max_tokens``, and a retry's prompt is the
    first attempt's (no ``retry_template`` or ``retry_system``, and ``prompt_template`` does not read
    ``previous``). Only a truncated sample's retry (more ``max_tokens``) can then differ. OpenAI
    batch records carry their own sampling: not decided here."""
    retries = {"rounds": cfg.retries.max_rounds > 1, "in_place": cfg.retries.max_attempts > 1}
    retries["hybrid"] = retries["rounds"] or retries["in_place"]
    if not retries[cfg.retries.strategy] or cfg.prompt.prompt_template is None:
        return None
    retry = cfg.retry()
    if retry.template is not None or retry.system is not None or reads_previous(cfg.prompt.prompt_template):
        return None
    try:
        base = SamplingParams.from_mapping(cfg.prompt.sampling)
    except ConfigError:
        return None  # refused elsewhere, with its reason
    if not _greedy(base):
        return None
    for _, fields in retry.sampling:
        entry = SamplingParams.from_mapping(fields, base)
        if dataclasses.replace(entry, seed=base.seed, max_tokens=base.max_tokens) != base:
            return None  # this retry samples otherwise (or is not greedy)
    return (
        "every retry would produce the same text as the attempt before it: sampling is greedy "
        f"(temperature {base.temperature:g}{', top_k 1' if base.top_k == 1 else ''}; a seed changes nothing "
        "then) and a retry's prompt is the first attempt's (no retry_template or retry_system, and "
        "prompt_template does not read previous), so only truncated samples, retried with more "
        "max_tokens, can change. Remedy: set sampling.temperature above 0 (each retry samples with its "
        "own seed), a retry_sampling entry that does, or a retry_template that shows the model "
        "previous.result and previous.reason"
    )


def thinking_budget_warnings(cfg: RunConfig) -> list[str]:
    """A thinking budget (``sampling``'s, or a ``retry_sampling`` entry's) that leaves the answer no
    room within ``max_tokens`` (:func:`~airflow_batchinfer.engines.budget.thinking_warnings`)."""
    sampling = cfg.prompt.sampling
    try:
        base = SamplingParams.from_mapping(sampling)
        entries = cfg.retry().sampling
    except ConfigError:
        return []  # refused elsewhere, with its reason
    out = thinking_warnings(sampling, base.max_tokens)
    for attempt, fields in entries:
        if THINKING_BUDGET in fields or completion_tokens(fields) is not None:  # else: sampling's, said
            merged = {**sampling, **fields}
            most = SamplingParams.from_mapping(fields, base).max_tokens
            out += thinking_warnings(merged, most, f"retry_sampling.{attempt}")
    return out


def retry_warnings(cfg: RunConfig) -> list[str]:
    """What the pre-flight warns of in ``cfg``'s settings: its retries, a thinking budget that leaves
    no room for the answer (the task log, its summary, the report and ``batchinfer run`` show it);
    the run goes on."""
    return [w for w in (same_retries(cfg),) if w is not None] + thinking_budget_warnings(cfg)


def _refuse_unhonoured(cfg: RunConfig, engine: dict[str, Any]) -> None:
    """Refuse a run whose ``sampling`` asks the pool's engine for a field it does not honour."""
    refusal = cfg.engine_refusal(str(engine.get("engine")))
    if refusal is not None:
        raise ConfigError(f"bad run settings: {refusal}")


def run_preflight(
    cfg: RunConfig,
    urls: list[str],
    token: str | None,
    so: StorageOptions | None = None,
    *,
    concurrency: int | None = None,
    max_map_length: int = sizing.DEFAULT_MAX_MAP_LENGTH,
    transport: httpx.AsyncBaseTransport | None = None,
    judge_pool: tuple[list[str], str | None] | None = None,
) -> PreflightSummary:
    """Sample, run infer and judge on the pool at ``urls``, store and return the projection.
    ``judge_pool``: the judge's own pool (its URLs and token), where the judge job runs instead.

    The summary's ``"sizing"`` is :func:`airflow_batchinfer.run.sizing.plan_run` for the whole dataset
    from the measured tokens/s (as one GPU's) and tokens per record, the measured approval rate, the
    ``len(urls)`` workers and the run's ``records_per_shard``, ``lanes``, ``chunk_size``, retry
    settings and ``max_map_length`` (Airflow's ``[core] max_map_length``, the most lanes a round
    maps); ``projected_wall_s`` and ``projected_gpu_hours`` are its totals (the lane shape, with the
    default straggler). ``concurrency``: jobs per worker (default: the workers' ``slots_total``, the fewest).
    ``transport``: for tests (an in-process worker).
    """
    workers = len(urls)
    layout = RunLayout(cfg.run_root)
    shards = pending_shards(layout, 0, so)
    total = sum(s.records for s in shards)
    sample_uri, n = _write_sample(cfg, layout, shards, so)
    jobs = _sample_jobs(cfg, layout, sample_uri, n)
    manifests, wall, slots = asyncio.run(
        _run_sample(
            cfg, jobs, urls, token, so, transport=transport, judge_pool=judge_pool, slots=not concurrency
        )
    )
    mi, mj = manifests[0], manifests[-1]  # the first job generated; the last one judged
    infer_s = mi.timings.run_s or 1e-9
    judge_s = mj.timings.run_s if mj is not mi else 0.0
    tokens = sum(sum(m.tokens.values()) for m in manifests)
    approval = mj.counts.outcomes.approved / n if n else 0.0
    per_record_s = (infer_s + judge_s) / n if n else 0.0
    passes = expected_passes(approval, cfg)
    wall_s = total * passes * per_record_s / max(workers, 1)
    tokens_per_s = tokens / (infer_s + judge_s)
    job_slots = concurrency or (min(slots) if slots else None)
    tokens_per_record = tokens / n if n else 0.0
    plan = _sizing(
        cfg, total, workers, job_slots, tokens_per_s, tokens_per_record, approval, max_map_length,
        [s.records for s in shards],
    )  # fmt: skip
    if "error" not in plan:
        wall_s = plan["wall_s"]  # the lanes' tail and the straggler included
    summary = PreflightSummary(
        sample_records=n,
        dataset_records=total,
        tokens_per_s=round(tokens_per_s, 1),
        approval_rate=round(approval, 4),
        expected_passes_per_record=round(passes, 3),
        workers=workers,
        projected_wall_s=round(wall_s, 1),
        projected_gpu_hours=round(wall_s * workers / 3600, 4),
        budget_gpu_hours=cfg.budget.budget_gpu_hours,
        sample_wall_s=round(wall, 3),
        note="measured on one job on one worker; the sizing spreads it over the workers' shard jobs "
        "on the run's lanes (a GPU's tokens/s shared by its jobs, the slowest GPU 1.5x slower). A full "
        "pool batches more per step: it errs long",
        sizing=plan,
        warnings=retry_warnings(cfg),
    )
    write_preflight(layout, summary, so)
    return summary


def _write_sample(
    cfg: RunConfig, layout: RunLayout, shards: list[ShardRef | RangeRef], so: StorageOptions | None
) -> tuple[str, int]:
    """Write the sample (``preflight_records`` records spread over round 0's shards) to the run's
    ``preflight/``; returns its URI and its record count."""
    sample_uri = join(layout.preflight, "sample.jsonl.zst")
    n = 0
    with JsonlFile(sample_uri, storage_options=so).writer_sync() as out:
        for shard, take in sample_plan([s.records for s in shards], cfg.budget.preflight_records):
            for row in itertools.islice(_records(cfg, shards[shard], so), take):
                out.write(row)
                n += 1
    return sample_uri, n


def _sample_jobs(cfg: RunConfig, layout: RunLayout, sample_uri: str, n: int) -> list[JobSpec]:
    """The jobs the sample runs: those the rounds run (one infer_judge job, or infer then judge on
    the judge's pool)."""
    p = layout.preflight
    judged = {"approved": join(p, "approved.jsonl.zst"), "rejected": join(p, "rejected.jsonl.zst")}
    if round_kinds(cfg, "rounds") == ("infer_judge",):
        params = cfg.infer_params().merge(cfg.judge_params())
        jobs = [_spec(cfg, "infer_judge", sample_uri, judged, params, records=n)]
    else:
        inferred = join(p, "inferred.jsonl.zst")
        jobs = [
            _spec(cfg, "infer", sample_uri, {"inferred": inferred}, cfg.infer_params(), records=n),
            _spec(cfg, "judge", inferred, judged, cfg.judge_params(), records=n),
        ]
    return jobs


async def _run_sample(
    cfg: RunConfig,
    jobs: list[JobSpec],
    urls: list[str],
    token: str | None,
    so: StorageOptions | None,
    *,
    transport: httpx.AsyncBaseTransport | None,
    judge_pool: tuple[list[str], str | None] | None,
    slots: bool,
) -> tuple[list[JobManifest], float, list[int]]:
    """Run ``jobs`` on the pool (a judge job on ``judge_pool`` when given), after refusing settings
    its engine does not honour; returns their manifests, the wall time and (``slots``) the workers'
    job slots."""
    pool = PoolClient(urls, token=token, storage_options=so, transport=transport)
    judges = pool
    if judge_pool is not None:
        judges = PoolClient(judge_pool[0], token=judge_pool[1], storage_options=so, transport=transport)
    t0 = time.monotonic()
    try:
        _refuse_unhonoured(cfg, await pool.engine())  # before any job: the run stops here
        done = [await (judges if spec.kind == "judge" else pool).run(spec) for spec in jobs]
        wall = time.monotonic() - t0
        job_slots = await _slots(pool) if slots else []
    finally:
        await pool.aclose()
        if judges is not pool:
            await judges.aclose()
    return done, wall, job_slots
