"""Shrink with the tail on Kubernetes: a run's lease lowered from 4 to 1 scales the Deployment down
after ``scaledown_ttl_s``, the idle pods ranked to go first (``pod-deletion-cost``; a control plane
of 1.22 or later keeps the pod with a running job, which the test then checks); the lease's ceiling
taken back scales it up again."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes", reason="needs the kubernetes extra")

from kubernetes import client

from airflow_batchinfer.pools.kubernetes import KubernetesPool
from airflow_batchinfer.pools.tail import BUSY_COST, DELETION_COST, IDLE_COST
from airflow_batchinfer.rpc.client import SyncWorkerClient
from airflow_batchinfer.run.jobs import job_spec
from airflow_batchinfer.run.plan import propose_slot
from airflow_batchinfer.run.prepare import prepare_run
from airflow_batchinfer.state.config import RunConfig
from tests.support.kube_fixture import Kube
from tests.support.kube_pools import spec

pytestmark = [pytest.mark.kubernetes, pytest.mark.slow]


def live_pods(kube: Kube, ns: str) -> list[Any]:
    return [
        p
        for p in client.CoreV1Api(kube.api).list_namespaced_pod(ns).items
        if p.metadata.deletion_timestamp is None
    ]


def wait_for(predicate: Any, what: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


def test_a_lease_lowered_to_one_keeps_the_busy_pod_and_its_ceiling_scales_it_back(
    kube: Kube, tmp_path: Path
) -> None:
    ns = kube.namespace()
    pool = KubernetesPool(kube.api, "pool", ns)
    # a batch takes 30 s: the job submitted below runs through the scale-down
    pool.ensure(spec(ns, tmp_path, scaledown_ttl_s=1, engine_options={"latency_base_s": 30.0}))
    assert pool.acquire("dag/run", 4) == 4
    pool.wait_ready(4, timeout_s=120)
    pods, port = pool._pods()
    by_url = {f"http://{p.status.pod_ip}:{port}": p.metadata.name for p in pods}

    src = tmp_path / "data.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "question": f"q {i}"}) + "\n" for i in range(10)))
    cfg = RunConfig.of(
        input=str(src), run_root=str(tmp_path / "run"), prompt_template="{{ question }}",
        judge={"type": "llm"}, records_per_shard=10,
    )  # fmt: skip
    cfg = cfg.replace(id_field=prepare_run(cfg).id_field)
    job = job_spec(cfg, "infer_judge", 0, propose_slot(cfg, "round-00").plan.shards[0])
    url = sorted(by_url)[0]
    with SyncWorkerClient(url, token=pool.token()) as worker:
        worker.submit(job)
        wait_for(lambda: worker.stats().slots_busy == 1, "the job running")
    busy = by_url[url]

    assert pool.want("dag/run", 1) == 4  # lower demand: kept for scaledown_ttl_s
    lease = pool.status()["leases"]["dag/run"]
    assert (lease["replicas"], lease["ceiling"]) == (1, 4)
    time.sleep(1.2)
    assert pool.reconcile() == 1  # what the reaper (or the next lane's want) does
    costs = {
        p.metadata.name: (p.metadata.annotations or {}).get(DELETION_COST)
        for p in client.CoreV1Api(kube.api).list_namespaced_pod(ns).items
    }
    assert costs == {name: str(BUSY_COST if name == busy else IDLE_COST) for name in by_url.values()}
    wait_for(lambda: len(live_pods(kube, ns)) == 1, "scaled down to one pod")
    version = client.VersionApi(kube.api).get_code()
    if (int(version.major), int("".join(c for c in version.minor if c.isdigit()))) >= (1, 22):
        # the ReplicaSet honours pod-deletion-cost (beta from 1.22): the busy pod stays, its job runs on
        assert [p.metadata.name for p in live_pods(kube, ns)] == [busy]
        with SyncWorkerClient(url, token=pool.token()) as worker:
            assert worker.status(job.job_id).state == "running"
            worker.cancel(job.job_id)
    # (an older controller picks by other ranks: a busy pod removed drains, its job handed back)

    assert pool.want("dag/run") == 4  # the next round: its ceiling back, at once
    wait_for(lambda: len(pool.endpoints()) == 4, "scaled back up")
    pool.release("dag/run")
    pool.scale_to_zero()
