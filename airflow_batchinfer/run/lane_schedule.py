"""List scheduling of shards on lanes, shard by shard: when each lane runs out of work, the tail,
and how long each GPU runs jobs. The simulation behind :mod:`~airflow_batchinfer.run.sizing`'s rounds
(a lane keeps the GPU it started on; a GPU's rate is shared evenly by its running jobs)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    """What :func:`schedule` found (seconds from the round's start).

    :ivar taken_by: the lane that ran each shard, in shard order.
    :ivar lane_end: when each lane ran out of work (its last job's end).
    :ivar gpu_busy_s: per GPU, how long it ran jobs (it idles only once its lanes have ended).
    """

    taken_by: tuple[int, ...]
    lane_end: tuple[float, ...]
    gpu_busy_s: tuple[float, ...]

    @property
    def wall_s(self) -> float:
        return max(self.lane_end, default=0.0)

    @property
    def tail_s(self) -> float:
        """From the first lane out of work to the last lane's end."""
        return self.wall_s - min(self.lane_end, default=0.0)


def schedule(work: Sequence[float], gpus: int, lanes: int, straggler: float = 1.0) -> Schedule:
    """List scheduling of shards on lanes: lane ``i`` runs on GPU ``i % gpus`` (GPU 0 the straggler,
    ``straggler`` times slower); at the start, and whenever lanes end a job at the same moment, they
    take the next shards in lane order; a GPU's rate is shared evenly by its running jobs.
    ``work``: each shard's GPU-seconds on a nominal GPU alone.

    Each GPU keeps a *virtual time*, the work each of its jobs has done (it grows at ``rate / jobs``),
    so a job ends when it reaches its start's plus its work: one heap event per finishing group, and
    50,000 shards schedule in well under a second."""
    lanes = min(lanes, len(work))
    rate = [1.0 / straggler] + [1.0] * (gpus - 1)
    vt = [0.0] * gpus  # work done by each job running on the GPU since t = 0
    at = [0.0] * gpus  # when vt was last brought up to date
    running = [0] * gpus
    jobs: list[list[tuple[float, int]]] = [[] for _ in range(gpus)]  # (virtual end, lane)
    events: list[tuple[float, int, int]] = []  # (real time of the GPU's next end, gpu, version)
    version = [0] * gpus
    taken_by = [0] * len(work)
    lane_end = [0.0] * lanes
    busy = [0.0] * gpus
    nxt = 0

    def take(lane: int, now: float) -> None:
        nonlocal nxt
        g = lane % gpus
        if nxt < len(work):
            taken_by[nxt] = lane
            heapq.heappush(jobs[g], (vt[g] + work[nxt], lane))
            nxt += 1
        else:
            running[g] -= 1
            lane_end[lane] = now
            busy[g] = now

    def rearm(g: int) -> None:
        version[g] += 1
        if jobs[g]:
            end = at[g] + (jobs[g][0][0] - vt[g]) * running[g] / rate[g]
            heapq.heappush(events, (end, g, version[g]))

    for lane in range(lanes):
        running[lane % gpus] += 1
        take(lane, 0.0)
    for g in range(gpus):
        rearm(g)
    while events:
        now = events[0][0]
        free: list[int] = []
        touched: list[int] = []
        # every GPU with a job ending now (equal shards end together): their lanes take work in order
        while events and events[0][0] <= now + 1e-9 * max(1.0, now):
            _, g, v = heapq.heappop(events)
            if v != version[g]:
                continue
            vt[g] = jobs[g][0][0]  # exactly: floating drift must not split a group of equal jobs
            at[g] = now
            while jobs[g] and jobs[g][0][0] <= vt[g] + 1e-9 * max(1.0, vt[g]):
                free.append(heapq.heappop(jobs[g])[1])
            touched.append(g)
        for lane in sorted(free):
            take(lane, now)
        for g in touched:
            rearm(g)
    return Schedule(tuple(taken_by), tuple(lane_end), tuple(busy))
