"""The GPU-seconds accounting (run/usage.py) from hand-built usage events: a keep run, a release run
with a re-warm, a pool another run keeps up, a tail that shrinks, a run from before the events."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from airflow_batchinfer.run.usage import NO_EVENTS, NO_LEASE, RoundSpan, account_usage
from airflow_batchinfer.run.usage_rounds import round_span
from airflow_batchinfer.state.docs.jobs import Timings
from airflow_batchinfer.state.docs.summary import WorkerTotals
from airflow_batchinfer.state.docs.usage import UsageEvent, WorkerStart
from airflow_batchinfer.state.docs.usage_account import UsageAccount

POOL = "kubernetes://batch/llm"


def lease(at: float, replicas: int, gpus: float = 1.0, pool: str = POOL) -> UsageEvent:
    return UsageEvent(kind="lease", at=at, pool=pool, replicas=replicas, gpus=gpus)


def gate(kind: str, at: float, policy: str, replicas: int = 0) -> UsageEvent:
    return UsageEvent(kind=kind, at=at, pool=POOL, replicas=replicas, slot="r00", policy=policy)  # type: ignore[arg-type]


def check_sums(acc: UsageAccount) -> None:
    parts = [acc.busy_gpu_s, acc.idle_gates_gpu_s, acc.idle_tails_gpu_s, acc.idle_other_gpu_s]
    assert acc.leased_gpu_s == pytest.approx(sum(p or 0.0 for p in parts), abs=1e-2)


# Two rounds of 100 s on 4 replicas of 2 GPUs: round 0 at 10-110, a gate 110-1110, round 1 1110-1210.
ROUNDS = [RoundSpan("r00", 0, 10.0, 110.0, busy_s=300.0), RoundSpan("r01", 1, 1110.0, 1210.0, busy_s=200.0)]


def test_keep_holds_the_replicas_through_the_gate() -> None:
    events = [
        lease(0.0, 4, gpus=2),
        gate("gate_open", 110.0, "keep", replicas=4),
        gate("gate_answered", 1110.0, "keep", replicas=4),
        lease(1220.0, 0, gpus=2),
    ]
    acc = account_usage(events, ROUNDS, until=2000.0)
    assert acc.known and not acc.open_lease
    assert acc.leased_gpu_s == 8 * 1220  # 4 replicas × 2 GPUs, 0 → 1220
    assert acc.idle_gates_gpu_s == 8 * 1000
    assert acc.keep_gpu_s == acc.leased_gpu_s and acc.saved_gpu_s == 0  # keep is what it did
    assert acc.busy_gpu_s == 2 * (300 + 200)  # busy worker-seconds × GPUs per replica
    assert acc.idle_tails_gpu_s == (800 - 600) + (800 - 400)  # 8 GPUs × 100 s a round, less busy
    assert [r.busy_fraction for r in acc.rounds] == [0.75, 0.5]
    assert acc.idle_other_gpu_s == 8 * 20  # setup 0-10, 1210-1220 before the teardown
    assert acc.rewarm_s == 0 and acc.warms == []
    check_sums(acc)


def test_release_gives_the_gate_back_and_pays_a_rewarm() -> None:
    starts = (WorkerStart(worker="w0", scheduled_s=1.0, started_s=5.0, loaded_s=40.0, ready_s=42.0),)
    events = [
        lease(0.0, 4, gpus=2),
        gate("gate_open", 110.0, "release", replicas=4),
        lease(410.0, 0, gpus=2),  # released after gate_keep_warm_s = 300
        gate("gate_answered", 1110.0, "release"),
        lease(1110.0, 4, gpus=2),
        UsageEvent(
            kind="warm", at=1152.0, pool=POOL, replicas=4, gpus=2, requested_at=1110.0, workers=starts
        ),
        lease(1300.0, 0, gpus=2),
    ]
    rounds = [ROUNDS[0], RoundSpan("r01", 1, 1152.0, 1252.0, busy_s=200.0)]
    acc = account_usage(events, rounds, until=1300.0)
    assert acc.idle_gates_gpu_s == 8 * 300  # the keep-warm only
    gate_ = acc.gates[0]
    assert (gate_.policy, gate_.wait_s, gate_.keep_gpu_s) == ("release", 1000.0, 8 * 1000)
    assert acc.saved_gpu_s == 8 * 1000 - 8 * 300  # keep would have held the whole wait
    assert acc.keep_gpu_s == acc.leased_gpu_s + acc.saved_gpu_s
    assert acc.rewarm_s == 42.0 and acc.warms[0].workers == starts
    assert acc.idle_other_gpu_s == 8 * (10 + 42 + 48)  # setup, the re-warm, after round 1
    assert not acc.open_lease and acc.note == ""
    check_sums(acc)


def test_a_pool_another_run_keeps_up_rewarms_in_no_time() -> None:
    """Released at once, but another run held the pool: its re-take is ready at once (no starts)."""
    events = [
        lease(0.0, 2),
        gate("gate_open", 110.0, "release", replicas=2),
        lease(110.0, 0),
        gate("gate_answered", 1110.0, "release"),
        lease(1110.0, 2),
        UsageEvent(kind="warm", at=1110.0, pool=POOL, replicas=2, requested_at=1110.0),
        lease(1210.0, 0),
        # the judge's own pool, a second lease of the run: pools add up
        lease(0.0, 1, gpus=4, pool="kubernetes://batch/judge"),
        lease(1210.0, 0, gpus=4, pool="kubernetes://batch/judge"),
    ]
    acc = account_usage(events, ROUNDS, until=1210.0)
    assert acc.idle_gates_gpu_s == 4 * 1000  # the judge pool's lease kept through the gate
    assert acc.gates[0].keep_gpu_s == (2 + 4) * 1000
    assert acc.rewarm_s == 0 and acc.warms[0].seconds == 0
    assert acc.leased_gpu_s == 2 * 210 + 4 * 1210
    check_sums(acc)


def test_a_shrinking_tail_leases_less_than_its_ceiling() -> None:
    events = [lease(0.0, 4), lease(60.0, 2), lease(90.0, 1), lease(100.0, 0)]
    rounds = [RoundSpan("r00", 0, 0.0, 100.0, busy_s=260.0)]
    acc = account_usage(events, rounds, until=500.0)
    assert acc.leased_gpu_s == 4 * 60 + 2 * 30 + 1 * 10  # not 4 × 100
    assert acc.rounds[0].idle_tail_gpu_s == 310 - 260
    assert acc.idle_other_gpu_s == 0 and acc.idle_gates_gpu_s == 0
    check_sums(acc)


def test_a_lanes_event_without_gpus_keeps_the_pools_gpus_per_replica() -> None:
    """The setup knows the spec's GPUs; a lane shrinking the demand records the default 1."""
    events = [lease(0.0, 4, gpus=8), lease(50.0, 1), lease(100.0, 0)]
    acc = account_usage(events, [], until=100.0)
    assert acc.leased_gpu_s == 8 * (4 * 50 + 1 * 50)


def test_busy_is_at_most_what_was_leased() -> None:
    acc = account_usage([lease(0.0, 1), lease(10.0, 0)], [RoundSpan("r00", 0, 0.0, 10.0, busy_s=50.0)], 10.0)
    assert acc.busy_gpu_s == 10 and acc.rounds[0].busy_fraction == 1.0


def test_a_lease_not_yet_released_counts_up_to_until_and_says_so() -> None:
    events = [lease(0.0, 2), gate("gate_open", 50.0, "keep", replicas=2)]
    acc = account_usage(events, [], until=150.0)
    assert acc.open_lease and acc.leased_gpu_s == 300
    assert acc.gates[0].answered_at is None and acc.gates[0].wait_s == 100
    assert "still held" in acc.note


def test_a_run_without_events_is_not_known_not_zero() -> None:
    acc = account_usage([], ROUNDS, until=2000.0)
    assert not acc.known and acc.note == NO_EVENTS
    assert acc.leased_gpu_s is None and acc.busy_gpu_s is None and acc.rounds == []
    gates_only = account_usage([gate("gate_open", 1.0, "keep")], [], until=2.0)
    assert not gates_only.known and gates_only.note == NO_LEASE


def test_the_account_round_trips_as_json() -> None:
    acc = account_usage([lease(0.0, 1), lease(5.0, 0)], [], until=5.0)
    assert UsageAccount.model_validate(acc.model_dump(mode="json")) == acc


def test_a_rounds_span_is_its_jobs_and_each_workers_busy_time_at_most_that() -> None:
    jobs = [
        SimpleNamespace(timings=Timings(started_at=100.0, finished_at=130.0, run_s=30.0)),
        SimpleNamespace(timings=Timings(started_at=110.0, finished_at=160.0, run_s=50.0)),
    ]
    # w1's two concurrent jobs each counted the batches they shared: 90 s in a 60 s round
    workers = {"w1": WorkerTotals(engine_busy_s=90.0), "w2": WorkerTotals(engine_busy_s=20.0)}
    span = round_span("round-00", 0, jobs, workers)  # type: ignore[arg-type]
    assert span == RoundSpan("round-00", 0, 100.0, 160.0, busy_s=60.0 + 20.0)
    assert round_span("round-01", 1, [], workers) is None  # no job ran


def test_a_released_gate_holds_nothing_once_its_lease_lapses_and_an_early_answer_keeps_it() -> None:
    """The gate records its opening with ``lease_ttl_s`` (nobody writes the lapse itself): the
    lease holds 0 from the lapse until the answer takes it again; an answer before the lapse
    leaves the lease held throughout."""
    pool = "local://p"

    def run(answer_at: float) -> UsageAccount:
        events = [
            UsageEvent(kind="lease", at=0, pool=pool, replicas=2),
            UsageEvent(kind="gate_open", at=100, pool=pool, replicas=2, slot="round-01", policy="release",
                       lease_ttl_s=10),
            UsageEvent(kind="gate_answered", at=answer_at, pool=pool, replicas=0, slot="round-01"),
            UsageEvent(kind="lease", at=answer_at, pool=pool, replicas=2, slot="round-01"),
            UsageEvent(kind="lease", at=answer_at + 50, pool=pool, replicas=0),
        ]  # fmt: skip
        return account_usage(events, [], until=answer_at + 50)

    late = run(1100)
    assert late.idle_gates_gpu_s == 2 * 10  # held only until the lapse
    assert late.keep_gpu_s == 2 * 1000 + late.leased_gpu_s - late.idle_gates_gpu_s
    assert late.saved_gpu_s == 2 * 990
    early = run(105)
    assert early.idle_gates_gpu_s == 2 * 5 and early.saved_gpu_s == 0
