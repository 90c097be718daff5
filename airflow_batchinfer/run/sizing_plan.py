"""The sizing plan as data and as text: :class:`SizingPlan` (what
:func:`~airflow_batchinfer.run.sizing.plan_run` returns, stored in the pre-flight's summary under
``"sizing"``), its rounds, and :meth:`SizingPlan.table`, what ``batchinfer plan`` prints."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.storage import taper

SIZING_VERSION = 3  # of SizingPlan.to_dict(); 2: lanes, the straggler, lost work; 3: lanes only


@dataclass(frozen=True)
class RoundPlan:
    """One round of a shape (times in seconds, GPU-seconds on the GPUs as they are: the straggler's
    work costs it ``straggler`` times more).

    :ivar round: 0 for the first pass; the in-place tail has the next number.
    :ivar mode: ``"rounds"`` (infer then judge, one pass a record) or ``"in_place"`` (retries inside
        the jobs: ``passes`` expected attempts a record).
    :ivar records: records entering the round (expected, from the approval rate).
    :ivar shards: shards of the round; ``records_per_shard`` their size (the last one the rest).
    :ivar lanes: the lanes running shards at once; ``mapped_tasks`` what Airflow maps (the lanes the
        run setting asks for, at most the shards).
    :ivar shards_per_lane: ``shards / lanes``: jobs a lane runs back to back.
    :ivar job_s: one shard job with its GPU's share of jobs, on a nominal GPU; ``slowest_job_s`` on
        the straggler.
    :ivar wall_s: the round's duration (its longest lane); ``gpu_hours`` the GPUs held for it
        (``gpus × wall_s``); ``busy_gpu_s`` GPU-seconds running jobs.
    :ivar tail_s: from the first lane out of work to the last lane's end; ``tail_idle_gpu_s`` the
        GPU-seconds held meanwhile without a job (``tail_idle_fraction`` of the round's GPU time).
    """

    round: int
    mode: str
    records: int
    passes: float
    shards: int
    records_per_shard: int
    lanes: int
    mapped_tasks: int
    shards_per_lane: float
    job_s: float
    slowest_job_s: float
    wall_s: float
    gpu_hours: float
    busy_gpu_s: float
    tail_s: float
    tail_idle_gpu_s: float
    tail_idle_fraction: float


@dataclass(frozen=True)
class ShapePlan:
    """A shard size's rounds and totals: wall, GPU-hours and what one lost worker costs.

    :ivar lost_records_per_failure: records redone when one worker dies mid-round (its jobs: a chunk
        each); ``lost_gpu_s_per_failure`` their GPU-seconds.
    """

    records_per_shard: int
    rounds: tuple[RoundPlan, ...]
    wall_s: float
    gpu_hours: float
    tail_s: float
    tail_idle_gpu_s: float
    tail_idle_fraction: float
    lost_records_per_failure: int
    lost_gpu_s_per_failure: float


@dataclass(frozen=True)
class SizingPlan:
    """What :func:`~airflow_batchinfer.run.sizing.plan_run` returns: the inputs, the pool, the rounds and
    totals (what the run will do), and notes (warnings and a better size where there is one). Stored (the
    pre-flight's ``summary.json``) as :meth:`to_dict`, ``version`` :data:`SIZING_VERSION`."""

    records: int
    gpus: int
    concurrency: int
    slots: int
    tokens_per_s: float
    tokens_per_record: float
    max_map_length: int
    lanes: int  # round 0's lanes (its mapped tasks): the run setting, or one per slot
    lanes_setting: int  # as asked: 0 = one per pool slot
    chunk_size: int
    max_job_s: float
    straggler: float
    approval_rate: float | None
    strategy: str
    max_rounds: int
    max_attempts: int
    expected_passes: float
    records_per_shard: int
    chosen: bool  # True when plan_run chose records_per_shard
    rounds: tuple[RoundPlan, ...]
    wall_s: float
    gpu_hours: float
    tail_s: float
    tail_idle_gpu_s: float
    tail_idle_fraction: float
    lost_records_per_failure: int
    lost_gpu_s_per_failure: float
    airflow_pool: str
    pool_command: str
    notes: tuple[str, ...] = ()
    version: int = SIZING_VERSION

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (rounds as a list of dicts); :meth:`from_dict` reads it back."""
        d = dataclasses.asdict(self)
        d["rounds"] = [dataclasses.asdict(r) for r in self.rounds]
        d["notes"] = list(self.notes)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SizingPlan:
        """Read :meth:`to_dict`'s data back; another version or unknown keys are refused."""
        if data.get("version") != SIZING_VERSION:
            raise ConfigError(
                f"sizing plan version {data.get('version')!r}, this release reads {SIZING_VERSION}: "
                "run `batchinfer plan` (or the pre-flight) again with this release"
            )
        _known(cls, data, "sizing plan")
        for r in data["rounds"]:
            _known(RoundPlan, r, "sizing round")
        return cls(
            **{
                **data,
                "rounds": tuple(RoundPlan(**r) for r in data["rounds"]),
                "notes": tuple(data.get("notes", ())),
            }
        )

    def table(self) -> str:
        """The plan as text: a header, the Airflow pool command, one line per round, totals, the work
        one lost worker costs, notes."""
        head = (
            f"{self.records:,} records on {self.gpus} GPU{'s' * (self.gpus != 1)} × {self.concurrency} jobs "
            f"= {self.slots:,} slots; "
            f"{self.tokens_per_s:,.0f} tokens/s per GPU, {self.tokens_per_record:,.0f} tokens per record"
        )
        if self.straggler != 1:
            head += f"; the slowest GPU {self.straggler:g}× slower"
        if self.approval_rate is not None:
            head += f"; approval {self.approval_rate:.0%}, strategy {self.strategy}"
        how = f"chosen: jobs of at most {duration(self.max_job_s)}" if self.chosen else "as given"
        cols = ["round", "mode", "records", "shards", "records/shard", "lanes", "shard job", "wall",
                "GPU-hours", "tail", "tail idle"]  # fmt: skip
        rows = [cols]
        for r in self.rounds:
            rows.append(
                [
                    str(r.round),
                    r.mode if r.passes == 1 else f"{r.mode} ×{r.passes:.2f}",
                    f"{r.records:,}",
                    f"{r.shards:,}",
                    f"{r.records_per_shard:,}",
                    f"{r.mapped_tasks:,} of {self.max_map_length:,}",
                    _job(r),
                    duration(r.wall_s),
                    _hours(r.gpu_hours),
                    duration(r.tail_s),
                    f"{gpu_time(r.tail_idle_gpu_s)} ({r.tail_idle_fraction:.2%})",
                ]
            )
        n = len(self.rounds)
        lines = [
            head,
            f"Airflow pool: {self.pool_command}",
            f"shards of {self.records_per_shard:,} records ({how})",
        ]
        first = self.rounds[0] if self.rounds else None
        if first is not None and first.shards > -(-first.records // self.records_per_shard):
            lines.append(
                f"round 0's last shards taper down to {taper.finest(self.records_per_shard):,.0f} records, "
                "so that its lanes end together"
            )
        lines.append("")
        lines += _columns(rows)
        lines += [
            "",
            f"total: {n} round{'s' * (n != 1)}, {self.expected_passes:.2f} passes per record: "
            f"{duration(self.wall_s)} wall, {_hours(self.gpu_hours)} GPU-hours "
            f"(tail {duration(self.tail_s)}, idle {gpu_time(self.tail_idle_gpu_s)}, "
            f"{self.tail_idle_fraction:.2%})",
            f"lost to one worker failure: {self.lost_records_per_failure:,} records, "
            f"{gpu_time(self.lost_gpu_s_per_failure)}",
        ]
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)


def _known(cls: type, data: dict[str, Any], what: str) -> None:
    names = {f.name for f in dataclasses.fields(cls)}
    missing, unknown = sorted(names - set(data) - {"notes", "version"}), sorted(set(data) - names)
    if missing or unknown:
        raise ConfigError(
            f"not a {what} of version {SIZING_VERSION} (missing {missing}, unknown {unknown}): "
            "run `batchinfer plan` (or the pre-flight) again with this release"
        )


def _columns(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def _job(r: RoundPlan) -> str:
    if r.slowest_job_s == r.job_s:
        return duration(r.job_s)
    return f"{duration(r.job_s)} ({duration(r.slowest_job_s)} slowest)"


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
