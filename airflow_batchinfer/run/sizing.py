"""Sizing before spending: shards, lanes, wall time, the tail, GPU-hours, the work a lost worker costs
and the Airflow pool for a run, from the record count, the GPUs and their measured tokens/s. Pure
arithmetic (no Airflow, no I/O): what ``batchinfer plan`` prints and what the pre-flight adds to its
summary under ``"sizing"``.

**The pool.** ``gpus`` workers (one GPU each) run ``concurrency`` shard jobs at a time, so the Airflow
pool has ``slots = gpus × concurrency`` (``include_deferred=True``). The GPU, not the slot, is the
bottleneck: a GPU turns out ``tokens_per_s`` tokens a second, shared evenly by the jobs it runs (one
token batcher per worker), and a record costs ``tokens_per_record`` tokens a pass. A GPU with fewer
jobs runs each faster, so it is busy for exactly its jobs' work and idles only once it has none.
The slowest GPU is ``straggler`` times slower than the others (1.5: one GPU at two thirds of the
rate; 1.0: none): the plan is for the pool you have, not the one on the data sheet.

**The shape (lanes).** A round maps one Airflow task per *lane* (``lanes``; 0: one per pool slot),
never more than ``[core] max_map_length``: that bounds the lanes, not the shards. Each lane takes the
next unclaimed shard when its current one ends, until none is left: list scheduling, which
:func:`~airflow_batchinfer.run.lane_schedule.schedule` simulates shard by shard (a lane keeps the GPU it
started on: its next submit goes to the slot it just freed). Shards are sized by a job-time target
(:func:`choose_records_per_shard`: jobs of at most ``max_job_s`` with ``concurrency`` jobs on a GPU), so a
lane that ends early takes more and the *tail* (the first lane out of work to the last lane's end) is about
one shard job. Round 0's last shards are cut finer for the lanes that run at once (:func:`lanes_at_once`), as
the input's plan cuts them (:mod:`~airflow_batchinfer.storage.taper`): the tail is about one of the smallest;
later rounds' recompacted shards are not (the pre-flight passes round 0's real sizes).

**Work lost to one worker failure**: its ``concurrency`` jobs resume after their last committed
chunk (``chunk_size`` records), so at most one chunk each is redone.

**Rounds.** Round ``r`` re-runs the share the judge rejected: ``records × (1 - approval)^r`` records,
recompacted into full shards of the same size (:func:`expected_passes`, the pre-flight's rule). In
place (``strategy="in_place"``, and the tail of ``"hybrid"`` after ``max_rounds`` rounds) is one round
whose jobs retry each record up to ``max_attempts`` times: ``sum((1 - approval)^k)`` passes a record.

**What it leaves out**: the seconds a lane spends between shards (a claim, its document, the job's
start: why shards have a floor, :data:`MIN_JOB_S`), the model load, storage reads and writes, and the
judge's own time unless ``tokens_per_record`` includes it (an LLM judge on the same pool runs over the
same shards, so its tokens simply add to the record's). Measured tokens/s from one job (the
pre-flight) under-states a GPU fed by ``concurrency`` jobs: the plan errs long.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.run.lane_schedule import schedule
from airflow_batchinfer.run.sizing_plan import RoundPlan, ShapePlan, SizingPlan, duration
from airflow_batchinfer.state.config_sections import STRATEGIES
from airflow_batchinfer.storage import taper

DEFAULT_TOKENS_PER_RECORD = 400
DEFAULT_MAX_MAP_LENGTH = 1024  # Airflow's [core] max_map_length default
DEFAULT_EXECUTION_TIMEOUT_S = 12 * 3600.0  # build_batch_inference_dag(execution_timeout=...): each job's
DEFAULT_MAX_JOB_S = 3600.0  # shard jobs of at most an hour: a retried shard re-runs minutes, not a day
DEFAULT_STRAGGLER = 1.5
DEFAULT_CHUNK_SIZE = 2_000  # a job's commit unit when the run's settings are not at hand
# The floor of a shard job: between two shards a lane claims one (a conditional write), updates its
# document, submits the job and notices its end (a 2 s poll): ~2-3 s per shard in which its slot runs
# nothing (the GPU's other jobs keep it busy meanwhile). At 60 s jobs that is at most ~5% of a slot.
MIN_JOB_S = 60.0


def expected_passes(
    approval: float, strategy: str = "rounds", max_rounds: int = 1, max_attempts: int = 1
) -> float:
    """Records processed per input record: every round (or in-place attempt) re-runs the share the
    judge rejected, assuming attempts succeed independently at the sample's approval rate.
    ``"rounds"``: ``max_rounds`` tries; ``"in_place"``: ``max_attempts``; ``"hybrid"``: both."""
    tries = {"rounds": max_rounds, "in_place": max_attempts}.get(strategy, max_rounds + max_attempts)
    return sum((1.0 - approval) ** k for k in range(tries))


# ------------------------------------------------------------------------------------ the sizes
def _whole(name: str, value: object, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{name} must be a whole number >= {minimum}, got {value!r}")
    return value


def choose_records_per_shard(
    records: int,
    jobs_per_gpu: int,
    lanes: int,
    record_s: float,
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    max_job_s: float = DEFAULT_MAX_JOB_S,
) -> int:
    """The lane shape's shard size: the largest whose job, sharing its GPU with ``jobs_per_gpu - 1``
    others (``jobs_per_gpu × rps × record_s`` seconds; ``concurrency`` with a lane per slot), takes
    at most ``max_job_s``; no bigger than it takes to give every lane a shard; no smaller than
    :data:`MIN_JOB_S` worth (per-shard overhead) unless ``max_job_s`` is shorter still; rounded down
    to a multiple of ``chunk_size`` when that keeps it above the floor (round figures; a job's later
    chunks then fill). ``record_s``: GPU-seconds a record pass costs alone on a GPU."""
    job_record_s = jobs_per_gpu * record_s  # a record's share of a job's wall
    top = max(1, math.floor(max_job_s / job_record_s * (1 + 1e-12)))  # 3600 / 1.6 is 2,250, not 2,249
    floor = min(top, max(1, math.ceil(MIN_JOB_S / job_record_s * (1 - 1e-12))))
    rps = min(top, max(floor, -(-records // lanes)), records)
    rounded = rps // chunk_size * chunk_size
    return rounded if rounded >= floor else rps


def lanes_at_once(requested: int, slots: int) -> int:
    """The lanes that run at once: the run setting ``lanes`` (0: one per pool slot), at most the
    pool's ``slots`` (more lanes wait for a slot: more tasks, no more speed)."""
    return min(requested or slots, slots)


def _round(
    r: int,
    mode: str,
    records: int,
    passes: float,
    rps: int,
    *,
    gpus: int,
    concurrency: int,
    runners: int,
    mapped: int,
    record_s: float,
    straggler: float,
    taper_lanes: int = 0,
    first_sizes: Sequence[int] | None = None,
) -> RoundPlan:
    """One round on ``runners`` lanes at once; ``mapped``: the lanes Airflow maps; round 0's shards
    are ``first_sizes`` (the planned input's) or ``records_per_shard`` each, the last ones tapered for
    ``taper_lanes`` lanes (:mod:`~airflow_batchinfer.storage.taper`)."""
    if r == 0 and first_sizes:
        sizes = list(first_sizes)
    else:
        sizes = taper.sizes(records, rps, taper_lanes if r == 0 else 0)
    shards = len(sizes)
    pass_s = passes * record_s
    sched = schedule([n * pass_s for n in sizes], gpus, runners, straggler)
    lanes = min(runners, shards)
    per_gpu = min(concurrency, -(-lanes // gpus))  # jobs sharing a GPU while every lane has work
    job = per_gpu * rps * pass_s
    wall = sched.wall_s
    busy = sum(sched.gpu_busy_s)
    idle = max(gpus * wall - busy, 0.0)
    return RoundPlan(
        round=r,
        mode=mode,
        records=records,
        passes=round(passes, 4),
        shards=shards,
        records_per_shard=rps,
        lanes=lanes,
        mapped_tasks=min(mapped, shards),
        shards_per_lane=round(shards / lanes, 4),
        job_s=round(job, 3),
        slowest_job_s=round(job * straggler, 3),
        wall_s=round(wall, 3),
        gpu_hours=round(gpus * wall / 3600, 4),
        busy_gpu_s=round(busy, 3),
        tail_s=round(sched.tail_s, 3),
        tail_idle_gpu_s=round(idle, 3),
        tail_idle_fraction=round(idle / (gpus * wall), 6) if wall else 0.0,
    )


def _shape(
    rps: int,
    *,
    records: int,
    reject: float,
    n_rounds: int,
    strategy: str,
    in_place_passes: float,
    runners: int,
    mapped: int,
    lost_records: int,
    **kw: Any,
) -> ShapePlan:
    """A shard size's rounds (``n_rounds`` rounds re-running the rejected share, then the in-place
    round unless ``strategy`` is ``"rounds"``) and totals; ``kw`` goes to each :func:`_round`
    (round 0's ``first_sizes`` or ``taper_lanes`` among them)."""
    plans: list[RoundPlan] = []
    for r in range(n_rounds):
        n = round(records * reject**r)
        if n < 1:
            break
        plans.append(_round(r, "rounds", n, 1.0, rps, runners=runners, mapped=mapped, **kw))
    if strategy != "rounds":
        n = round(records * reject**n_rounds)
        if n >= 1:
            plans.append(
                _round(n_rounds, "in_place", n, in_place_passes, rps, runners=runners, mapped=mapped, **kw)
            )
    gpus: int = kw["gpus"]
    wall = sum(p.wall_s for p in plans)
    idle = sum(p.tail_idle_gpu_s for p in plans)
    return ShapePlan(
        records_per_shard=rps,
        rounds=tuple(plans),
        wall_s=round(wall, 3),
        gpu_hours=round(gpus * wall / 3600, 4),
        tail_s=round(sum(p.tail_s for p in plans), 3),
        tail_idle_gpu_s=round(idle, 3),
        tail_idle_fraction=round(idle / (gpus * wall), 6) if wall else 0.0,
        lost_records_per_failure=lost_records,
        lost_gpu_s_per_failure=round(lost_records * kw["record_s"], 3),
    )


def plan_run(
    records: int,
    gpus: int,
    tokens_per_s: float,
    *,
    concurrency: int | None = None,
    tokens_per_record: float = DEFAULT_TOKENS_PER_RECORD,
    max_map_length: int = DEFAULT_MAX_MAP_LENGTH,
    lanes: int = 0,
    chunk_size: int | None = None,
    max_job_s: float = DEFAULT_MAX_JOB_S,
    straggler: float = DEFAULT_STRAGGLER,
    records_per_shard: int | None = None,
    shard_sizes: Sequence[int] | None = None,
    approval_rate: float | None = None,
    max_rounds: int = 1,
    strategy: str = "rounds",
    max_attempts: int = 3,
    execution_timeout_s: float | None = DEFAULT_EXECUTION_TIMEOUT_S,
    airflow_pool: str = "batchinfer",
) -> SizingPlan:
    """Size a run of ``records`` records on ``gpus`` workers (see the module doc for the model).

    :param tokens_per_s: tokens a second one GPU turns out (measured: the pre-flight prints it).
    :param concurrency: shard jobs per worker (the worker's ``--concurrency``); ``None``: the
        ``concurrency`` setting's default (:func:`airflow_batchinfer.spec.settings.setting`).
    :param tokens_per_record: tokens one record costs a pass: prompt + completion (+ an LLM judge's).
    :param max_map_length: Airflow's ``[core] max_map_length``: the most lanes one round may map.
    :param lanes: the run setting ``lanes``: tasks a round maps (0: one per pool slot).
    :param chunk_size: records a job commits at a time; ``None``: the ``chunk_size`` setting's default.
    :param max_job_s: the longest shard job the chosen size allows (its GPU running ``concurrency``).
    :param straggler: how many times slower the slowest GPU is (1.0: none).
    :param records_per_shard: the shard size to assess; ``None``: choose it
        (:func:`choose_records_per_shard`).
    :param shard_sizes: round 0's shards as the input was planned (records each: the pre-flight's),
        instead of ``records_per_shard`` each with the last ones tapered for the lanes at once.
    :param approval_rate: the judge's approval rate (the pre-flight measures it); ``None``: one pass.
    :param max_rounds, strategy, max_attempts: the run's retry settings.
    :param execution_timeout_s: ``build_batch_inference_dag``'s ``execution_timeout``, each shard
        job's bound; a longer job, or a lane longer than it, gets a note.
    :param airflow_pool: the Airflow pool name for the printed command.
    :raises ConfigError: on a bad input, or more lanes than ``max_map_length``; the message names the
        remedy.
    """
    concurrency, chunk_size = _setting_defaults(concurrency, chunk_size)
    _check_inputs(records=records, gpus=gpus, concurrency=concurrency, max_map_length=max_map_length,
                  chunk_size=chunk_size, max_rounds=max_rounds, max_attempts=max_attempts, lanes=lanes,
                  tokens_per_s=tokens_per_s, tokens_per_record=tokens_per_record, straggler=straggler,
                  max_job_s=max_job_s, approval_rate=approval_rate, strategy=strategy)  # fmt: skip
    slots = gpus * concurrency
    want = _mapped_lanes(lanes, slots, max_map_length)
    record_s = tokens_per_record / tokens_per_s
    runners = lanes_at_once(lanes, slots)
    # A dead worker's jobs (as many as its GPU runs) each redo at most their uncommitted chunk.
    per_gpu = min(concurrency, -(-runners // gpus))  # jobs sharing a GPU (fewer lanes: fewer)
    best = choose_records_per_shard(
        records, per_gpu, runners, record_s, chunk_size=chunk_size, max_job_s=max_job_s
    )
    chosen = records_per_shard is None
    rps = best if records_per_shard is None else _whole("records_per_shard", records_per_shard)
    approval = 1.0 if approval_rate is None else approval_rate
    common = _shape_args(records, approval, strategy, max_rounds, max_attempts, gpus=gpus,
                         concurrency=concurrency, record_s=record_s, straggler=straggler)  # fmt: skip
    new = _shape(rps, runners=runners, mapped=want, taper_lanes=runners, first_sizes=shard_sizes,
                 lost_records=per_gpu * min(chunk_size, rps, records), **common)  # fmt: skip
    notes = _notes(new, rps=rps, best=best, chosen=chosen, gpus=gpus, concurrency=concurrency,
                   slots=slots, want=want, max_job_s=max_job_s, execution_timeout_s=execution_timeout_s,
                   common=common)  # fmt: skip
    notes += _still_rejected(records, approval_rate, strategy, max_rounds)
    passes = 1.0 if approval_rate is None else expected_passes(approval, strategy, max_rounds, max_attempts)
    return SizingPlan(
        records=records, gpus=gpus, concurrency=concurrency, slots=slots, tokens_per_s=float(tokens_per_s),
        tokens_per_record=float(tokens_per_record), max_map_length=max_map_length,
        lanes=new.rounds[0].mapped_tasks, lanes_setting=lanes, chunk_size=chunk_size,
        max_job_s=float(max_job_s), straggler=float(straggler), approval_rate=approval_rate,
        strategy=strategy, max_rounds=max_rounds, max_attempts=max_attempts,
        expected_passes=round(passes, 4), chosen=chosen, airflow_pool=airflow_pool,
        pool_command=f'airflow pools set {airflow_pool} {slots} "batchinfer shard slots" --include-deferred',
        notes=tuple(notes), **_totals(new),
    )  # fmt: skip


def _setting_defaults(concurrency: int | None, chunk_size: int | None) -> tuple[int, int]:
    """``concurrency`` and ``chunk_size``, their settings' defaults where ``None``."""
    if concurrency is None or chunk_size is None:  # here: the settings' module pulls in storage
        from airflow_batchinfer.spec.settings import setting

        concurrency = int(setting("concurrency").default) if concurrency is None else concurrency
        chunk_size = int(setting("chunk_size").default) if chunk_size is None else chunk_size
    return concurrency, chunk_size


def _shape_args(
    records: int,
    approval: float,
    strategy: str,
    max_rounds: int,
    max_attempts: int,
    *,
    gpus: int,
    concurrency: int,
    record_s: float,
    straggler: float,
) -> dict[str, Any]:
    """What every shape :func:`plan_run` assesses shares: :func:`_shape`'s and :func:`_round`'s
    arguments other than the shard size and the lanes."""
    return {
        "records": records,
        "reject": 1.0 - approval,
        "n_rounds": 0 if strategy == "in_place" else max_rounds,
        "strategy": strategy,
        "in_place_passes": expected_passes(approval, "in_place", max_attempts=max_attempts),
        "gpus": gpus,
        "concurrency": concurrency,
        "record_s": record_s,
        "straggler": straggler,
    }


def _totals(shape: ShapePlan) -> dict[str, Any]:
    """The shape's size, rounds and totals, as :class:`SizingPlan`'s fields of the same names."""
    return {f.name: getattr(shape, f.name) for f in dataclasses.fields(shape)}


def _check_inputs(
    *,
    records: int,
    gpus: int,
    concurrency: int,
    max_map_length: int,
    chunk_size: int,
    max_rounds: int,
    max_attempts: int,
    lanes: int,
    tokens_per_s: float,
    tokens_per_record: float,
    straggler: float,
    max_job_s: float,
    approval_rate: float | None,
    strategy: str,
) -> None:
    """Refuse :func:`plan_run`'s bad inputs, each with what a good one is."""
    for name, value in (
        ("records", records),
        ("gpus", gpus),
        ("concurrency", concurrency),
        ("max_map_length", max_map_length),
        ("chunk_size", chunk_size),
        ("max_rounds", max_rounds),
        ("max_attempts", max_attempts),
    ):
        _whole(name, value)
    _whole("lanes (0: one per pool slot)", lanes, 0)
    if not tokens_per_s > 0:
        raise ConfigError(
            f"tokens_per_s must be > 0, got {tokens_per_s!r}: measure it (the pre-flight log prints "
            "tokens/s) and pass the tokens/s of one GPU"
        )
    if not tokens_per_record > 0:
        raise ConfigError(f"tokens_per_record must be > 0 (prompt + completion), got {tokens_per_record!r}")
    if not (isinstance(straggler, int | float) and math.isfinite(straggler) and straggler >= 1):
        raise ConfigError(
            f"straggler must be a finite number >= 1 (how many times slower the slowest GPU is; 1: "
            f"none), got {straggler!r}"
        )
    if not (math.isfinite(max_job_s) and max_job_s > 0):
        raise ConfigError(f"max_job_s must be > 0 (the longest shard job to size for), got {max_job_s!r}")
    if approval_rate is not None and not 0.0 <= approval_rate <= 1.0:
        raise ConfigError(f"approval_rate is a share between 0 and 1, got {approval_rate!r}")
    if strategy not in STRATEGIES:
        raise ConfigError(f"strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}")


def _mapped_lanes(lanes: int, slots: int, max_map_length: int) -> int:
    """The lanes a round maps (the run setting; 0: one per pool slot), refused over ``max_map_length``."""
    want = lanes or slots
    if want > max_map_length:
        raise ConfigError(
            f"{want:,} lanes{' (one per pool slot)' * (not lanes)}, but a round maps one task per lane "
            f"and max_map_length is {max_map_length:,}. Remedy: set the run setting lanes (--lanes) to "
            f"at most {max_map_length:,}, or raise [core] max_map_length (AIRFLOW__CORE__MAX_MAP_LENGTH) "
            "on the scheduler and workers"
        )
    return want


def _still_rejected(records: int, approval_rate: float | None, strategy: str, max_rounds: int) -> list[str]:
    """A note on the records the judge is still expected to reject after the last of ``"rounds"``."""
    if approval_rate is None or approval_rate >= 1 or strategy != "rounds":
        return []
    left = round(records * (1.0 - approval_rate) ** max_rounds)
    if not left:
        return []
    return [
        f"about {left:,} records are still rejected after {max_rounds} round"
        f"{'s' * (max_rounds != 1)} (raise max_rounds, or strategy hybrid to retry them in place)"
    ]


def _notes(
    new: ShapePlan,
    *,
    rps: int,
    best: int,
    chosen: bool,
    gpus: int,
    concurrency: int,
    slots: int,
    want: int,
    max_job_s: float,
    execution_timeout_s: float | None,
    common: dict[str, Any],
) -> list[str]:
    """Warnings about the rounds of ``new``, and a better size than a given one's."""
    notes: list[str] = []
    first = new.rounds[0]
    if want > slots:
        notes.append(
            f"lanes={want:,} is more than the pool's {slots:,} slots: the extra lanes wait for a slot "
            f"(more tasks, no more speed); leave lanes at 0 for one per slot"
        )
    elif want < slots:
        notes.append(
            f"lanes={want:,} on {slots:,} slots: {slots - want:,} slots stay empty "
            f"(about {first.lanes / gpus:.1f} jobs a GPU instead of {concurrency})"
        )
    longest = max(p.slowest_job_s for p in new.rounds)
    if not chosen and first.job_s > max_job_s and rps != best:
        runners = lanes_at_once(want, slots)
        alt = _shape(best, runners=runners, mapped=want, lost_records=0, taper_lanes=runners, **common)
        notes.append(
            f"records_per_shard={rps:,} makes jobs of {duration(first.job_s)}; records_per_shard={best:,} "
            f"(jobs of at most {duration(max_job_s)}) has a tail of {duration(alt.rounds[0].tail_s)} "
            f"instead of {duration(first.tail_s)} for round 0: a lost or retried shard costs less"
        )
    if execution_timeout_s is not None and longest > execution_timeout_s:
        notes.append(
            f"a shard job runs up to {duration(longest)} on the slowest GPU, over the "
            f"{duration(execution_timeout_s)} execution_timeout (each job's bound): lower "
            f"records_per_shard (or --max-job-s), or raise it (build_batch_inference_dag("
            f"execution_timeout=...)) to about {duration(longest * 1.5)} (a 50% margin)"
        )
    lane_s = max(p.wall_s for p in new.rounds)
    if execution_timeout_s is not None and lane_s > execution_timeout_s:
        notes.append(
            f"a lane runs about {first.shards_per_lane:,.0f} shard jobs back to back: {duration(lane_s)}, "
            f"longer than the {duration(execution_timeout_s)} execution_timeout. "
            "build_batch_inference_dag bounds each job with it and gives the lane tasks none; a lane "
            f"task given an execution_timeout of its own needs more than {duration(lane_s)}"
        )
    if first.job_s < MIN_JOB_S and first.shards > first.lanes:
        notes.append(
            f"shard jobs take {duration(first.job_s)}: a lane spends a few seconds between shards "
            "(claim, submit, poll); fewer, larger shards waste less"
        )
    return notes
