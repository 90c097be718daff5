"""A run's GPU-seconds (:class:`~airflow_batchinfer.state.docs.usage_account.UsageAccount`), from its
usage events (:func:`~airflow_batchinfer.state.docs.usage.read_usage`: leases, gates, pool starts)
and its rounds' spans (:class:`RoundSpan`: when its jobs ran and how long its engines were busy).

Pure: :func:`account_usage` reads nothing. The lease held over time is a step function of the
``lease`` events (per pool, the last one's replicas × the pool's GPUs per replica, the most any of
its events says; pools add up); everything
leased is busy (per round: the engines' busy worker-seconds × GPUs, at most what was leased), idle at
a gate (leased between its ``gate_open`` and ``gate_answered``), idle in a round's tail (leased in
the round, not busy) or idle otherwise (setup, warm-ups, between rounds). ``keep`` would have held
at each gate what the lease held when it opened, for the whole wait.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from airflow_batchinfer.state.docs.usage import UsageEvent
from airflow_batchinfer.state.docs.usage_account import GateUsage, RoundUsage, UsageAccount, WarmUsage

NO_EVENTS = (
    "no usage events under usage/: the run predates them, or its pool is one the run does not "
    "lease (a static pool); its GPU-seconds are not known"
)
NO_LEASE = "usage events but no lease event: the lease's setup predates them; GPU-seconds not known"


@dataclass(frozen=True)
class RoundSpan:
    """One round's jobs: their first start and last end (Unix time) and the engines' busy
    worker-seconds in it (the batcher's busy time, each worker's at most the span)."""

    slot: str
    round: int
    started_at: float
    ended_at: float
    busy_s: float


class _Held:
    """The lease's GPUs and replicas over time: a step function of the lease events."""

    def __init__(self, leases: Sequence[UsageEvent]) -> None:
        # A pool's GPUs per replica: the most any of its events says (the setup's knows the spec;
        # a lane's or a gate's event may leave the default 1).
        gpus_of: dict[str, float] = {}
        for e in leases:
            gpus_of[e.pool] = max(gpus_of.get(e.pool, 0.0), e.gpus)
        per_pool: dict[str, tuple[int, float]] = {}
        self.times: list[float] = []
        self.gpus: list[float] = []  # held from times[i] on
        self.replicas: list[int] = []
        for e in sorted(leases, key=lambda e: e.at):
            per_pool[e.pool] = (max(e.replicas, 0), gpus_of[e.pool])
            gpus = sum(r * g for r, g in per_pool.values())
            replicas = sum(r for r, _ in per_pool.values())
            if self.times and self.times[-1] == e.at:  # events at one instant: the last one holds
                self.gpus[-1], self.replicas[-1] = gpus, replicas
            else:
                self.times.append(e.at)
                self.gpus.append(gpus)
                self.replicas.append(replicas)

    def before(self, t: float) -> float:
        """GPUs held just before ``t`` (events at ``t`` not yet in force)."""
        i = bisect.bisect_left(self.times, t) - 1
        return self.gpus[i] if i >= 0 else 0.0

    def integral(self, a: float, b: float, replicas: bool = False) -> float:
        """GPU-seconds (``replicas``: replica-seconds) held in [a, b]."""
        values: Sequence[float] = self.replicas if replicas else self.gpus
        total = 0.0
        for i, t in enumerate(self.times):
            end = self.times[i + 1] if i + 1 < len(self.times) else b
            lo, hi = max(t, a), min(end, b)
            if hi > lo:
                total += values[i] * (hi - lo)
        return total

    @property
    def last_gpus(self) -> float:
        return self.gpus[-1] if self.gpus else 0.0


def account_usage(events: Sequence[UsageEvent], rounds: Sequence[RoundSpan], until: float) -> UsageAccount:
    """The run's GPU-seconds up to ``until`` (see the module doc); ``known`` false, with the reason,
    for a run without lease events."""
    if not events:
        return UsageAccount(known=False, note=NO_EVENTS)
    leases = [e for e in events if e.kind == "lease"]
    if not leases:
        return UsageAccount(known=False, note=NO_LEASE)
    leases += _lapses(events)
    held = _Held(leases)
    start = held.times[0]
    leased = held.integral(start, until)
    gates = _gates(events, held, until)
    spans = [_round(r, held, leases) for r in rounds]
    warms = [_warm(e) for e in events if e.kind == "warm"]
    busy = sum(r.busy_gpu_s for r in spans)
    at_gates = sum(g.leased_gpu_s for g in gates)
    tails = sum(r.idle_tail_gpu_s for r in spans)
    keep = leased - at_gates + sum(g.keep_gpu_s for g in gates)
    notes = []
    if held.last_gpus > 0 and max(e.at for e in leases) < until:
        notes.append(f"the lease is still held (no release recorded): counted up to {until:.0f}")
    return UsageAccount(
        known=True,
        note="; ".join(notes),
        until=until,
        open_lease=held.last_gpus > 0,
        leased_gpu_s=_r(leased),
        busy_gpu_s=_r(busy),
        idle_gates_gpu_s=_r(at_gates),
        idle_tails_gpu_s=_r(tails),
        idle_other_gpu_s=_r(max(leased - busy - at_gates - tails, 0.0)),
        keep_gpu_s=_r(keep),
        saved_gpu_s=_r(keep - leased),
        rewarm_s=_r(sum(w.seconds for w in warms)),
        rounds=spans,
        gates=gates,
        warms=warms,
    )


def _lapses(events: Sequence[UsageEvent]) -> list[UsageEvent]:
    """A released gate's lease lapsing (``lease_ttl_s`` after its opening) before its answer, as a
    lease of 0 replicas then: no process writes that moment, the pool's rules make it."""
    out = []
    for gate in (e for e in events if e.kind == "gate_open" and e.lease_ttl_s is not None):
        lapse = gate.at + (gate.lease_ttl_s or 0.0)
        answered = next(
            (a.at for a in events if a.kind == "gate_answered" and a.slot == gate.slot and a.at >= gate.at),
            None,
        )
        if answered is None or answered > lapse:
            out.append(UsageEvent(kind="lease", at=lapse, pool=gate.pool, replicas=0, slot=gate.slot))
    return out


def _gates(events: Sequence[UsageEvent], held: _Held, until: float) -> list[GateUsage]:
    """Each gate_open paired with the first later gate_answered of its slot (none: still waiting)."""
    answers = [e for e in events if e.kind == "gate_answered"]
    out = []
    for e in (e for e in events if e.kind == "gate_open"):
        answer = next((a for a in answers if a.slot == e.slot and a.at >= e.at), None)
        if answer is not None:
            answers.remove(answer)
        end = until if answer is None else answer.at
        wait = max(end - e.at, 0.0)
        out.append(
            GateUsage(
                slot=e.slot,
                policy=e.policy,
                opened_at=e.at,
                answered_at=None if answer is None else answer.at,
                wait_s=_r(wait),
                leased_gpu_s=_r(held.integral(e.at, end)),
                keep_gpu_s=_r(held.before(e.at) * wait),
            )
        )
    return out


def _round(span: RoundSpan, held: _Held, leases: Sequence[UsageEvent]) -> RoundUsage:
    """A round's share: its busy GPU-seconds (busy worker-seconds × the GPUs per replica held in the
    span, at most what was leased) and the rest of what was leased in it, its tail idle."""
    a, b = span.started_at, max(span.ended_at, span.started_at)
    leased = held.integral(a, b)
    replica_s = held.integral(a, b, replicas=True)
    gpus = leased / replica_s if replica_s else max(e.gpus for e in leases)
    busy = min(leased, span.busy_s * gpus)
    return RoundUsage(
        slot=span.slot,
        round=span.round,
        started_at=a,
        ended_at=b,
        busy_s=_r(span.busy_s),
        leased_gpu_s=_r(leased),
        busy_gpu_s=_r(busy),
        busy_fraction=round(busy / leased, 4) if leased else None,
        idle_tail_gpu_s=_r(leased - busy),
    )


def _warm(e: UsageEvent) -> WarmUsage:
    requested = e.at if e.requested_at is None else e.requested_at
    return WarmUsage(
        pool=e.pool,
        slot=e.slot,
        requested_at=requested,
        ready_at=e.at,
        seconds=_r(max(e.at - requested, 0.0)),
        workers=e.workers,
    )


def _r(x: float) -> float:
    return round(x, 3)
