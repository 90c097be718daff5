"""The pool setup's readiness decision on a real Kubernetes pool (issue 12 item 3): a warm
Deployment of the wanted spec is ready at once; after a settings change it is not ready until the
rollout has replaced every pod of the old template, although old pods still answer ready."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

pytest.importorskip("kubernetes", reason="needs the kubernetes extra")
pytest.importorskip("airflow", reason="needs the airflow extra")

from airflow_batchinfer.pools.kubernetes import KubernetesPool
from airflow_batchinfer.triggers.pool_ready import observe_pool, pool_readiness
from tests.support.kube_fixture import Kube
from tests.support.kube_pools import spec

pytestmark = [pytest.mark.kubernetes, pytest.mark.slow]


def decide(pool: KubernetesPool, key: str, replicas: int = 2) -> str:
    obs = asyncio.run(observe_pool(pool, pool.token()))
    return pool_readiness(obs, replicas, spec_key=key)


def test_ready_only_once_the_deployment_runs_the_wanted_spec(kube: Kube, tmp_path: Path) -> None:
    ns = kube.namespace()
    pool = KubernetesPool(kube.api, "pool", ns)
    old = spec(ns, tmp_path)
    pool.ensure(old)
    pool.acquire("run-1", 2)
    pool.wait_ready(2, timeout_s=90)
    t0 = time.monotonic()
    assert decide(pool, old.key()) == "ready"  # warm, same spec: the setup returns inline
    assert time.monotonic() - t0 < 1.0
    pool.release("run-1")

    new = spec(ns, tmp_path, port=old.port, engine_options={"approval_rate": 0.9})
    assert pool.ensure(new, lease_id="run-2") == "updated"
    pool.acquire("run-2", 2)
    # right after the change: old pods may still answer ready, but the rollout is not done
    assert decide(pool, new.key()) == "wait"
    deadline = time.monotonic() + 120
    while decide(pool, new.key()) != "ready":
        assert time.monotonic() < deadline, pool.rollout()
        time.sleep(0.5)
    # once ready, every ready pod runs the new template
    assert pool.rollout() == {"spec_key": new.key(), "current_ready": 2}
    assert len(pool.endpoints()) == 2
