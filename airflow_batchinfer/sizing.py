"""Sizing before spending: shards, waves, wall time, GPU-hours and the Airflow pool for a run, from
the record count, the GPUs and their measured tokens/s. Pure arithmetic (no Airflow, no I/O): what
``batchinfer plan`` prints and what the pre-flight adds to its summary under ``"sizing"``.

**The model.** ``gpus`` workers (one GPU each) run ``concurrency`` shard jobs at a time, so the Airflow
pool has ``slots = gpus × concurrency`` (``include_deferred=True``). The GPU, not the slot, is the
bottleneck: a GPU turns out ``tokens_per_s`` tokens a second, shared evenly by the jobs it runs (one
token batcher per worker), and a record costs ``tokens_per_record`` tokens per pass. A round maps one
task per shard (its *map length*, at most Airflow's ``[core] max_map_length``). Shards hold
``records_per_shard`` records, the last one the rest. With ``S`` shards on ``P`` slots the jobs run in
``ceil(S / P)`` *waves*: Airflow starts ``P`` jobs, the pool places ``concurrency`` on each GPU, and
equal shards sharing a GPU end together, so every full wave takes ``concurrency × records_per_shard ×
tokens_per_record / tokens_per_s``. The last wave's ``L`` shards go to the GPUs round-robin (a submit
goes to the least-loaded worker); a GPU with fewer jobs runs them faster, so it is busy for exactly its
own jobs' work and **idles only once it has no job left**. The wave ends with the busiest GPU; the other
GPUs' wait until then is the *tail idle* (GPU-seconds paid for with no job to run). A round's
GPU-hours are ``gpus × wall`` (the GPUs are held for the round), busy work plus tail idle.

**Rounds.** Round ``r`` re-runs the share the judge rejected: ``records × (1 - approval)^r`` records,
recompacted into full shards of the same size (:func:`expected_passes`, the pre-flight's rule). In
place (``strategy="in_place"``, and the tail of ``"hybrid"`` after ``max_rounds`` rounds) is one round
whose jobs retry each record up to ``max_attempts`` times: ``sum((1 - approval)^k)`` passes a record.

**What it leaves out**: Airflow's own seconds per task (shards should take minutes), the model load,
storage reads and writes, and the judge's own time unless ``tokens_per_record`` includes it (an LLM judge
on the same pool runs over the same shards, so its tokens simply add to the record's). Measured
tokens/s from one job (the pre-flight) under-states a GPU fed by ``concurrency`` jobs: the plan errs
long.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.run.modes import STRATEGIES

DEFAULT_TOKENS_PER_RECORD = 400
DEFAULT_MAX_MAP_LENGTH = 1024  # Airflow's [core] max_map_length default
DEFAULT_EXECUTION_TIMEOUT_S = 12 * 3600.0  # build_batch_inference_dag(execution_timeout=...) default
MIN_JOB_S = 60.0  # below this, Airflow's seconds per task are a real share of a shard's time


def expected_passes(
    approval: float, strategy: str = "rounds", max_rounds: int = 1, max_attempts: int = 1
) -> float:
    """Records processed per input record: every round (or in-place attempt) re-runs the share the
    judge rejected, assuming attempts succeed independently at the sample's approval rate.
    ``"rounds"``: ``max_rounds`` tries; ``"in_place"``: ``max_attempts``; ``"hybrid"``: both."""
    tries = {"rounds": max_rounds, "in_place": max_attempts}.get(strategy, max_rounds + max_attempts)
    return sum((1.0 - approval) ** k for k in range(tries))


@dataclass(frozen=True)
class RoundPlan:
    """One round of a :class:`SizingPlan` (times in seconds).

    :ivar round: 0 for the first pass; the in-place tail has the next number.
    :ivar mode: ``"rounds"`` (infer then judge, one pass a record) or ``"in_place"`` (retries inside
        the jobs: ``passes`` expected attempts a record).
    :ivar records: records entering the round (expected, from the approval rate).
    :ivar shards: shards of the round; also its map length (one mapped task per shard per phase).
    :ivar records_per_shard: the shard size (the last shard holds the rest).
    :ivar waves: ``ceil(shards / slots)``; ``wave_fill`` is ``shards / slots`` (3.12 = 3 full waves and
        one 12% full).
    :ivar last_wave_shards: shards in the last wave; ``tail_empty_slots`` the slots it leaves empty.
    :ivar job_s: the longest shard job (a full wave's, or the busiest GPU's in the last wave).
    :ivar wall_s: the round's duration; ``gpu_hours`` the GPUs held for it (``gpus × wall_s``).
    :ivar busy_gpu_s: GPU-seconds of work; ``tail_idle_gpu_s`` GPU-seconds without a job
        (``tail_idle_fraction`` of the round's GPU time); ``tail_idle_s`` how long the last wave runs
        after the first GPU ran out of jobs.
    """

    round: int
    mode: str
    records: int
    passes: float
    shards: int
    records_per_shard: int
    waves: int
    wave_fill: float
    last_wave_shards: int
    tail_empty_slots: int
    job_s: float
    wall_s: float
    gpu_hours: float
    busy_gpu_s: float
    tail_idle_s: float
    tail_idle_gpu_s: float
    tail_idle_fraction: float


@dataclass(frozen=True)
class SizingPlan:
    """What :func:`plan_run` returns: the inputs, the pool, one :class:`RoundPlan` per expected round,
    totals, and notes (warnings and a better shard size where there is one)."""

    records: int
    gpus: int
    concurrency: int
    slots: int
    tokens_per_s: float
    tokens_per_record: float
    max_map_length: int
    approval_rate: float | None
    strategy: str
    max_rounds: int
    max_attempts: int
    expected_passes: float
    rounds: tuple[RoundPlan, ...]
    wall_s: float
    gpu_hours: float
    tail_idle_gpu_s: float
    tail_idle_fraction: float
    airflow_pool: str
    pool_command: str
    chosen: bool  # True when plan_run chose records_per_shard
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (rounds as a list of dicts); :meth:`from_dict` reads it back."""
        d = dataclasses.asdict(self)
        d["rounds"] = [dataclasses.asdict(r) for r in self.rounds]
        d["notes"] = list(self.notes)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SizingPlan:
        rounds = tuple(RoundPlan(**r) for r in data["rounds"])
        return cls(**{**data, "rounds": rounds, "notes": tuple(data.get("notes", ()))})

    def table(self) -> str:
        """The plan as text: a header, the Airflow pool command, one line per round, totals, notes."""
        head = (
            f"{self.records:,} records on {self.gpus} GPU{'s' * (self.gpus != 1)} × {self.concurrency} jobs "
            f"= {self.slots:,} slots; "
            f"{self.tokens_per_s:,.0f} tokens/s per GPU, {self.tokens_per_record:,.0f} tokens per record"
        )
        if self.approval_rate is not None:
            head += f"; approval {self.approval_rate:.0%}, strategy {self.strategy}"
        cols = [
            "round",
            "mode",
            "records",
            "shards",
            "records/shard",
            "waves",
            "map length",
            "shard job",
            "wall",
            "GPU-hours",
            "tail idle",
        ]
        rows = [cols]
        for r in self.rounds:
            row = [
                str(r.round),
                r.mode if r.passes == 1 else f"{r.mode} ×{r.passes:.2f}",
                f"{r.records:,}",
                f"{r.shards:,}",
                f"{r.records_per_shard:,}",
                f"{r.waves} ({r.wave_fill:.2f})",
                f"{r.shards:,} of {self.max_map_length:,}",
                duration(r.job_s),
                duration(r.wall_s),
                _hours(r.gpu_hours),
                f"{gpu_time(r.tail_idle_gpu_s)} ({r.tail_idle_fraction:.2%})",
            ]
            rows.append(row)
        widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
        lines = [head, f"Airflow pool: {self.pool_command}", ""]
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
        n = len(self.rounds)
        lines += [
            "",
            f"total: {n} round{'s' * (n != 1)}, {self.expected_passes:.2f} passes per record: "
            f"{duration(self.wall_s)} wall, {_hours(self.gpu_hours)} GPU-hours "
            f"(tail idle {gpu_time(self.tail_idle_gpu_s)}, {self.tail_idle_fraction:.2%})",
        ]
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)


def duration(seconds: float) -> str:
    """``51 s``, ``12.5 min``, ``46.3 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:,.1f} h"


def gpu_time(seconds: float) -> str:
    """GPU time: ``51 GPU-s``, ``12.5 GPU-min``, ``106.7 GPU-h``."""
    value, unit = duration(seconds).split(" ")
    return f"{value} GPU-{unit}"


def _hours(hours: float) -> str:
    return f"{hours:,.1f}" if hours >= 10 else f"{hours:.3f}"


def _whole(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} must be a whole number >= 1, got {value!r}")
    return value


def _shards(records: int, rps: int) -> int:
    return -(-records // rps)


def choose_records_per_shard(records: int, gpus: int, concurrency: int, max_map_length: int) -> int:
    """The shard size for the fewest waves with no tail: the largest shard count that is a whole
    multiple of the slots (``gpus × concurrency``) and at most ``max_map_length`` and ``records``. When
    the slots are more than one round can map, a multiple of ``gpus`` (every GPU gets as many jobs);
    with fewer records than GPUs, one record a shard."""
    cap = min(max_map_length, records)
    for unit in (gpus * concurrency, gpus):
        # Shards hold records_per_shard records each (the last the rest), so not every count is
        # reachable: take the largest reachable multiple of the unit.
        for count in range(cap // unit * unit, 0, -unit):
            rps = -(-records // count)
            if _shards(records, rps) == count:
                return rps
    return -(-records // cap)


def _round(
    r: int, mode: str, records: int, passes: float, rps: int, gpus: int, concurrency: int, record_s: float
) -> RoundPlan:
    """One round's waves and times; ``record_s``: GPU-seconds a record pass costs alone on a GPU."""
    slots = gpus * concurrency
    shards = _shards(records, rps)
    sizes = [rps] * (shards - 1) + [records - (shards - 1) * rps]
    waves = -(-shards // slots)
    last = sizes[(waves - 1) * slots :]
    full_wave_s = concurrency * rps * passes * record_s  # c equal jobs per GPU end together
    per_gpu = [sum(last[g::gpus]) * passes * record_s for g in range(gpus)]  # round-robin
    last_s = max(per_gpu)
    wall = (waves - 1) * full_wave_s + last_s
    busy = records * passes * record_s
    idle = max(gpus * wall - busy, 0.0)
    return RoundPlan(
        round=r,
        mode=mode,
        records=records,
        passes=round(passes, 4),
        shards=shards,
        records_per_shard=rps,
        waves=waves,
        wave_fill=round(shards / slots, 4),
        last_wave_shards=len(last),
        tail_empty_slots=waves * slots - shards,
        job_s=round(max(last_s, full_wave_s if waves > 1 else 0.0), 3),
        wall_s=round(wall, 3),
        gpu_hours=round(gpus * wall / 3600, 4),
        busy_gpu_s=round(busy, 3),
        tail_idle_s=round(last_s - min(per_gpu), 3),
        tail_idle_gpu_s=round(idle, 3),
        tail_idle_fraction=round(idle / (gpus * wall), 6) if wall else 0.0,
    )


def plan_run(
    records: int,
    gpus: int,
    tokens_per_s: float,
    *,
    concurrency: int | None = None,
    tokens_per_record: float = DEFAULT_TOKENS_PER_RECORD,
    max_map_length: int = DEFAULT_MAX_MAP_LENGTH,
    records_per_shard: int | None = None,
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
        ``concurrency`` setting's default (:func:`airflow_batchinfer.settings.setting`).
    :param tokens_per_record: tokens one record costs a pass: prompt + completion (+ an LLM judge's).
    :param max_map_length: Airflow's ``[core] max_map_length``: the most shards one round may map.
    :param records_per_shard: the shard size to assess; ``None``: choose it
        (:func:`choose_records_per_shard`).
    :param approval_rate: the judge's approval rate (the pre-flight measures it); ``None``: one pass.
    :param max_rounds, strategy, max_attempts: the run's retry settings.
    :param execution_timeout_s: a shard task's ``execution_timeout``; a longer job gets a note.
    :param airflow_pool: the Airflow pool name for the printed command.
    :raises ConfigError: on a bad input, or a given ``records_per_shard`` that makes more shards than
        ``max_map_length``; the message names the remedy.
    """
    if concurrency is None:  # imported here: the settings' module pulls in storage and templates
        from airflow_batchinfer.settings import setting

        concurrency = int(setting("concurrency").default)
    for name, value in (
        ("records", records),
        ("gpus", gpus),
        ("concurrency", concurrency),
        ("max_map_length", max_map_length),
        ("max_rounds", max_rounds),
        ("max_attempts", max_attempts),
    ):
        _whole(name, value)
    if not tokens_per_s > 0:
        raise ConfigError(
            f"tokens_per_s must be > 0, got {tokens_per_s!r}: measure it (the pre-flight log prints "
            "tokens/s) and pass the tokens/s of one GPU"
        )
    if not tokens_per_record > 0:
        raise ConfigError(f"tokens_per_record must be > 0 (prompt + completion), got {tokens_per_record!r}")
    if approval_rate is not None and not 0.0 <= approval_rate <= 1.0:
        raise ConfigError(f"approval_rate is a share between 0 and 1, got {approval_rate!r}")
    if strategy not in STRATEGIES:
        raise ConfigError(f"strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}")
    slots = gpus * concurrency
    best = choose_records_per_shard(records, gpus, concurrency, max_map_length)
    chosen = records_per_shard is None
    if records_per_shard is None:
        rps = best
    else:
        rps = _whole("records_per_shard", records_per_shard)
        if _shards(records, rps) > max_map_length:
            raise ConfigError(
                f"records_per_shard={rps:,} makes {_shards(records, rps):,} shards, but a round maps one "
                f"task per shard and max_map_length is {max_map_length:,}. Remedy: records_per_shard >= "
                f"{-(-records // max_map_length):,} (or leave it out to let the plan choose {best:,}), or "
                "raise [core] max_map_length (AIRFLOW__CORE__MAX_MAP_LENGTH) on the scheduler and workers"
            )

    record_s = tokens_per_record / tokens_per_s
    approval = 1.0 if approval_rate is None else approval_rate
    reject = 1.0 - approval
    plans: list[RoundPlan] = []
    n_rounds = 0 if strategy == "in_place" else max_rounds
    for r in range(n_rounds):
        n = round(records * reject**r)
        if n < 1:
            break
        plans.append(_round(r, "rounds", n, 1.0, rps, gpus, concurrency, record_s))
    if strategy != "rounds":
        n = round(records * reject**n_rounds)
        if n >= 1:
            passes = expected_passes(approval, "in_place", max_attempts=max_attempts)
            plans.append(_round(n_rounds, "in_place", n, passes, rps, gpus, concurrency, record_s))
    wall = sum(p.wall_s for p in plans)
    idle = sum(p.tail_idle_gpu_s for p in plans)

    notes: list[str] = []
    first = plans[0]
    if gpus > max_map_length:
        notes.append(
            f"{gpus} GPUs but a round maps at most {max_map_length:,} shards: {gpus - max_map_length} GPUs "
            "never get a job. Raise [core] max_map_length or use fewer GPUs"
        )
    elif slots > max_map_length:
        notes.append(
            f"the pool's {slots:,} slots are more than one round maps ({max_map_length:,}): the shard "
            f"count is a multiple of the {gpus} GPUs instead, fewer than {concurrency} jobs a GPU"
        )
    if not chosen and first.tail_idle_fraction > 0.001 and rps != best:
        alt = _round(first.round, first.mode, first.records, first.passes, best, gpus, concurrency, record_s)
        notes.append(
            f"{first.shards:,} shards on {slots:,} slots is {first.wave_fill:.2f} waves; "
            f"records_per_shard={best:,} makes {alt.shards:,} shards in {alt.waves} waves: "
            f"{duration(alt.wall_s)} instead of {duration(first.wall_s)} for round {first.round}, tail "
            f"idle {alt.tail_idle_fraction:.2%} instead of {first.tail_idle_fraction:.2%}"
        )
    longest = max(p.job_s for p in plans)
    if execution_timeout_s is not None and longest > execution_timeout_s:
        notes.append(
            f"a shard job runs up to {duration(longest)}, over the {duration(execution_timeout_s)} "
            f"execution_timeout: raise it (build_batch_inference_dag(execution_timeout=...)) to about "
            f"{duration(longest * 1.5)} (a 50% margin), or add GPUs, or raise max_map_length for smaller "
            "shards"
        )
    if first.job_s < MIN_JOB_S and first.shards > 1:
        notes.append(
            f"shard jobs take {duration(first.job_s)}: Airflow spends one to a few seconds per shard task; "
            "fewer, larger shards waste less"
        )
    if approval_rate is not None and approval_rate < 1 and strategy == "rounds":
        left = round(records * reject**max_rounds)
        if left:
            notes.append(
                f"about {left:,} records are still rejected after {max_rounds} round"
                f"{'s' * (max_rounds != 1)} (raise max_rounds, or strategy hybrid to retry them in place)"
            )
    return SizingPlan(
        records=records,
        gpus=gpus,
        concurrency=concurrency,
        slots=slots,
        tokens_per_s=float(tokens_per_s),
        tokens_per_record=float(tokens_per_record),
        max_map_length=max_map_length,
        approval_rate=approval_rate,
        strategy=strategy,
        max_rounds=max_rounds,
        max_attempts=max_attempts,
        expected_passes=round(
            1.0 if approval_rate is None else expected_passes(approval, strategy, max_rounds, max_attempts), 4
        ),
        rounds=tuple(plans),
        wall_s=round(wall, 3),
        gpu_hours=round(gpus * wall / 3600, 4),
        tail_idle_gpu_s=round(idle, 3),
        tail_idle_fraction=round(idle / (gpus * wall), 6) if wall else 0.0,
        airflow_pool=airflow_pool,
        pool_command=f'airflow pools set {airflow_pool} {slots} "batchinfer shard slots" --include-deferred',
        chosen=chosen,
        notes=tuple(notes),
    )
