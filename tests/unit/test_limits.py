"""The judge-pool rule, in one place: a judge's own pool is not the run's pool, however written."""

from __future__ import annotations

import pytest

from airflow_batchinfer.spec.limits import TriggerLimits, judge_pool_refusal, refusals


@pytest.mark.parametrize(
    ("judge_pool", "worker_pool", "refused"),
    [
        ("local://gpu", "local://gpu", True),
        (" local://gpu ", "local://gpu", True),  # the same pool, written another way
        ("kubernetes://ml/judge", "kubernetes://ml/judge/", True),
        ("gpu_pool", "gpu_pool", True),  # one connection
        ("local://judge", "local://gpu", False),
        ("kubernetes://ml/gpu", "kubernetes://other/gpu", False),
        ("local://gpu", None, False),  # no run pool named: nothing to compare
        (None, "local://gpu", False),
        ("", "local://gpu", False),
        ("nope://x", "nope://x", True),  # unparsable: compared as written
    ],
)
def test_the_judge_pool_may_not_be_the_runs_pool(
    judge_pool: str | None, worker_pool: str | None, refused: bool
) -> None:
    why = judge_pool_refusal(judge_pool, worker_pool)
    assert (why is not None) == refused
    if why is not None:
        assert "is the run's own worker_pool" in why and "leave judge_pool out" in why


def test_the_dag_params_check_refuses_it_with_that_reason() -> None:
    limits = TriggerLimits(allowed_worker_pools=("local://gpu",))
    params = {"worker_pool": "local://gpu", "judge_pool": " local://gpu"}
    assert judge_pool_refusal(" local://gpu", "local://gpu") in refusals(params, limits)
    assert not any(
        "own worker_pool" in w for w in refusals({**params, "judge_pool": "local://judge"}, limits)
    )
