"""The lease rules every pool backend shares (the worker reads them too), without a server."""

from __future__ import annotations

import json

from airflow_batchinfer.worker.leases import LEASES, PoolState


def state(replicas: int = 0, **kw: float) -> PoolState:
    return PoolState(replicas=replicas, idle_ttl_s=kw.get("idle", 60), scaledown_ttl_s=kw.get("down", 10))


def test_demand_is_the_largest_live_lease_and_scale_up_is_immediate() -> None:
    s = state()
    s.acquire("a", 2, now=0, ttl_s=100)
    s.acquire("b", 3, now=1, ttl_s=100)
    assert s.decide(1) == 3


def test_lower_demand_waits_scaledown_ttl() -> None:
    s = state(3, down=10)
    s.acquire("b", 1, now=0, ttl_s=100)
    assert s.decide(0) == 3 and s.low_since == 0
    assert s.decide(9.9) == 3
    assert s.decide(10) == 1 and s.low_since is None
    s.replicas = 1
    s.acquire("c", 2, now=11, ttl_s=100)  # demand back up: at once, and the damping clock resets
    assert s.decide(11) == 2 and s.low_since is None


def test_idle_pool_stays_warm_for_idle_ttl_then_goes_to_zero() -> None:
    s = state(2, idle=60)
    s.acquire("a", 2, now=0, ttl_s=100)
    s.release("a", now=5)
    assert s.decide(64.9) == 2  # a back-to-back run finds it warm
    assert s.decide(65) == 0


def test_expired_lease_is_dropped_and_counts_as_the_last_use() -> None:
    s = state(2, idle=60)
    s.acquire("crashed", 2, now=0, ttl_s=30)
    assert s.decide(29) == 2
    assert s.decide(31) == 2 and "crashed" not in s.leases and s.last_used == 30
    assert s.decide(90) == 0


def test_a_live_run_renews_its_lease_and_a_lapsed_one_cannot() -> None:
    s = state(1, idle=60)
    s.acquire("long-run", 1, now=0, ttl_s=30)
    assert s.renew("long-run", now=25, ttl_s=30) and s.leases["long-run"].expires == 55
    assert not s.renew("long-run", now=56, ttl_s=30)  # lapsed: renewing cannot resurrect it
    assert not s.renew("never-held", now=1, ttl_s=30)


def test_a_pool_never_used_starts_its_idle_clock_when_first_seen() -> None:
    s = state(2, idle=60)  # e.g. applied from k8s/ with replicas set by hand
    assert s.decide(1000) == 2 and s.last_used == 1000
    assert s.decide(1060) == 0


def test_annotations_round_trip() -> None:
    s = state(1, idle=30, down=5)
    s.acquire("dag/run 1", 2, now=10, ttl_s=3600)
    a = s.annotations()
    back = PoolState.from_annotations(
        1, {k: v for k, v in a.items() if v is not None}, idle_ttl_s=0, scaledown_ttl_s=0
    )
    assert back == s and json.loads(a[LEASES] or "")["dag/run 1"]["replicas"] == 2


def test_a_lease_wants_fewer_with_its_tail_within_its_ceiling_and_takes_them_back() -> None:
    s = state(4, down=10)
    s.acquire("run", 4, now=0, ttl_s=100)
    assert s.leases["run"].ceiling == 4
    assert s.want("run", 1, now=5) and s.leases["run"].replicas == 1
    assert s.leases["run"].expires == 100  # a demand is not a renewal
    assert s.decide(5) == 4 and s.decide(15) == 1  # the tail's scale-down still waits scaledown_ttl
    s.replicas = 1
    assert s.want("run", 9, now=16) and s.leases["run"].replicas == 1  # a number never raises it
    assert s.want("run", -3, now=17) and s.leases["run"].replicas == 0
    assert s.want("run", None, now=18) and s.decide(18) == 4  # the next round: all back, at once


def test_the_largest_demand_wins_and_a_gone_lease_cannot_want() -> None:
    s = state(3, down=0)
    s.acquire("tail", 3, now=0, ttl_s=100)
    s.acquire("other", 2, now=0, ttl_s=100)
    s.want("tail", 1, now=1)
    assert s.decide(1) == 2  # the other run still wants 2
    assert not s.want("never-held", 1, now=1)
    assert not s.want("tail", 1, now=101)  # lapsed


def test_a_lease_from_before_ceilings_loads_and_its_replicas_are_its_ceiling() -> None:
    old = {LEASES: json.dumps({"run": {"replicas": 3, "acquired": 0, "expires": 100}})}
    s = PoolState.from_annotations(3, old, idle_ttl_s=60, scaledown_ttl_s=10)
    assert s.leases["run"].ceiling is None and s.leases["run"].most == 3
    assert s.want("run", 1, now=1) and (s.leases["run"].replicas, s.leases["run"].ceiling) == (1, 3)
    back = PoolState.from_dict(s.to_dict())
    assert back.leases["run"].ceiling == 3 and back.describe(1)["leases"]["run"]["ceiling"] == 3


def test_a_lapsed_lease_counts_its_expiry_as_the_last_use_for_a_local_worker_too() -> None:
    """A gate gives its lease back by letting it lapse: the workers stay ``idle_ttl_s`` past the
    expiry, not past the lease's renewal (which would stop them the moment it lapses)."""
    state = PoolState(replicas=2, idle_ttl_s=10.0, scaledown_ttl_s=0.0)
    state.acquire("dag/run", 2, now=100.0, ttl_s=50.0)  # last_used 100, expires 150
    assert not state.idle_expired(149.0)  # live lease
    assert not state.idle_expired(155.0)  # lapsed 5 s ago: within idle_ttl of the expiry
    assert state.idle_expired(160.0)
    state.decide(170.0)  # the reaper's view agrees: the expiry is the last use
    assert state.last_used == 150.0
