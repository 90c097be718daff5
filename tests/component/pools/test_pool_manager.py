"""The Kubernetes pool manager against a real API server, with the kubelet stand-in running each pod's
worker command as a local process: scale the Deployment, workers come up, jobs run over RPC."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes", reason="needs the kubernetes extra")

from kubernetes import client

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.pools.kubernetes import KubernetesPool
from airflow_batchinfer.pools.kubernetes.objects import worker_deployment
from airflow_batchinfer.rpc.client import SyncWorkerClient
from airflow_batchinfer.rpc.pool import PoolClient
from airflow_batchinfer.run.pipeline import run_pipeline
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.storage import JsonlDir
from airflow_batchinfer.worker.leases import LEASES
from tests.support.kube_fixture import Kube
from tests.support.kube_pools import spec

pytestmark = [pytest.mark.kubernetes, pytest.mark.slow]
BIN = str(Path(sys.executable).parent / "batchinfer")


def pods(kube: Kube, ns: str) -> list[Any]:
    return [
        p
        for p in client.CoreV1Api(kube.api).list_namespaced_pod(ns).items
        if p.metadata.deletion_timestamp is None
    ]


def wait_for(predicate: Any, timeout: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what or str(predicate))
        time.sleep(0.2)


def test_create_scale_discover_run_a_job_and_scale_to_zero(kube: Kube, tmp_path: Path) -> None:
    ns = kube.namespace()
    pool = KubernetesPool(kube.api, "pool", ns)
    sp = spec(ns, tmp_path)
    assert pool.ensure(sp) == "created"
    assert pool.ensure(sp) == "unchanged"
    assert pool.acquire("run-1", 2) == 2
    urls = pool.wait_ready(2, timeout_s=90)
    assert len(urls) == 2 and all(u.startswith(f"http://{kube.kubelet.net}.") for u in urls)
    # the scheduler placed each worker on a tainted GPU node with one GPU
    running = pods(kube, ns)
    assert {p.spec.node_name for p in running} <= set(kube.kubelet.nodes)
    assert all(p.spec.containers[0].resources.limits["nvidia.com/gpu"] == "1" for p in running)
    # the RPC token comes from the pool's Secret; workers refuse anything else
    token = pool.token()
    for url in urls:
        with SyncWorkerClient(url, token=token) as c:
            assert c.stats().slots_total == 2
        with SyncWorkerClient(url, token="wrong") as c, pytest.raises(Exception, match=r"401|token"):
            c.stats()
    status = pool.status()
    assert status["replicas"] == 2 and set(status["leases"]) == {"run-1"}
    assert sorted(w["url"] for w in status["workers"]) == urls and not status["problems"]

    # a run over the discovered workers
    src = dataset(tmp_path, 40)
    summary = asyncio.run(run(src, tmp_path / "run", pool, max_rounds=1))
    assert summary["invariant"]["ok"] and summary["approved"] + summary["remaining_pending"] == 40

    # only the lease holder's release lets it go; with idle_ttl passed it scales to zero
    with pytest.raises(ConfigError, match="leased by"):
        pool.scale_to_zero()
    assert pool.release("run-1") == 2  # warm for idle_ttl
    assert pool.scale_to_zero() == 0
    wait_for(lambda: not pods(kube, ns) and not pool.endpoints(), what="pods gone after scale to zero")


def test_the_pool_has_its_network_policy_from_setup_to_delete(kube: Kube, tmp_path: Path) -> None:
    """Issue 22, item 8: setup creates the pool's NetworkPolicy (only Airflow's pods to the RPC port),
    a changed ``rpc_from_namespace`` updates it without replacing a worker, delete removes it."""
    ns = kube.namespace()
    net = client.NetworkingV1Api(kube.api)
    pool = KubernetesPool(kube.api, "pool", ns)
    sp = spec(ns, tmp_path)
    assert pool.ensure(sp) == "created"
    policy = net.read_namespaced_network_policy("pool-rpc", ns)
    assert policy.spec.pod_selector.match_labels["app.kubernetes.io/instance"] == "pool"
    (rule,) = policy.spec.ingress
    assert [p.port for p in rule.ports] == [sp.port] and rule._from[0].namespace_selector is None
    version = policy.metadata.resource_version
    assert pool.ensure(sp) == "unchanged"
    assert net.read_namespaced_network_policy("pool-rpc", ns).metadata.resource_version == version
    moved = spec(ns, tmp_path, port=sp.port, rpc_from_namespace="airflow")
    assert pool.ensure(moved) == "unchanged"  # who may call is the policy's: no worker replaced
    peer = net.read_namespaced_network_policy("pool-rpc", ns).spec.ingress[0]._from[0]
    assert peer.namespace_selector.match_labels == {"kubernetes.io/metadata.name": "airflow"}
    pool.delete()
    assert not net.list_namespaced_network_policy(ns).items


def test_changed_settings_replace_workers_only_when_no_other_run_holds_the_pool(
    kube: Kube, tmp_path: Path
) -> None:
    ns = kube.namespace()
    pool = KubernetesPool(kube.api, "pool", ns)
    sp = spec(ns, tmp_path)
    pool.ensure(sp)
    pool.acquire("run-a", 1)
    other = spec(ns, tmp_path, port=sp.port, engine_options={"approval_rate": 0.9})
    with pytest.raises(ConfigError, match=r"leased by \['run-a'\]"):
        pool.ensure(other)
    pool.release("run-a")
    assert pool.ensure(other) == "updated"
    dep = client.AppsV1Api(kube.api).read_namespaced_deployment("pool", ns)
    assert dep.spec.template.spec.containers[0].args == ["--engine-arg=approval_rate=0.9"]


def test_workers_run_as_the_specs_service_account_and_a_spec_without_one_drops_it(
    kube: Kube, tmp_path: Path
) -> None:
    """``service_account`` and ``image_pull_secrets`` reach the pods the API admits (the ServiceAccount
    admission checks the account exists and mounts no token: ``automountServiceAccountToken`` is
    false); a later spec without them removes them from the template (the update is a merge patch)."""
    ns = kube.namespace()
    core, apps = client.CoreV1Api(kube.api), client.AppsV1Api(kube.api)
    core.create_namespaced_service_account(ns, {"metadata": {"name": "batchinfer-s3"}})
    pool = KubernetesPool(kube.api, "pool", ns)
    sp = spec(ns, tmp_path, service_account="batchinfer-s3", image_pull_secrets=("regcred",),
              node_selector={"nvidia.com/gpu.present": "true"})  # fmt: skip
    assert pool.ensure(sp) == "created"
    pool.acquire("run", 1)
    assert len(pool.wait_ready(1, timeout_s=90)) == 1
    (pod,) = pods(kube, ns)
    assert pod.spec.service_account_name == "batchinfer-s3"
    assert [s.name for s in pod.spec.image_pull_secrets] == ["regcred"]
    assert not [v for v in pod.spec.volumes or [] if v.secret or v.projected]  # no API token mounted
    pool.release("run")
    plain = spec(ns, tmp_path, port=sp.port)
    assert pool.ensure(plain) == "updated"
    template = apps.read_namespaced_deployment("pool", ns).spec.template.spec
    assert template.service_account_name is None and template.service_account is None
    assert template.image_pull_secrets is None and template.node_selector is None
    pool.scale_to_zero()


def test_adopts_a_deployment_applied_from_manifests(kube: Kube, tmp_path: Path) -> None:
    """A Deployment someone applied (no spec hash): leased and scaled, its template never touched."""
    ns = kube.namespace()
    sp = spec(ns, tmp_path, name="gitops")
    body = worker_deployment(sp)
    del body["metadata"]["annotations"]
    client.AppsV1Api(kube.api).create_namespaced_deployment(ns, body)
    pool = KubernetesPool(kube.api, "gitops", ns)
    assert pool.ensure(spec(ns, tmp_path, name="gitops", engine_options={"x": 1})) == "adopted"
    pool.acquire("run", 1)
    assert len(pool.wait_ready(1, timeout_s=90)) == 1
    dep = client.AppsV1Api(kube.api).read_namespaced_deployment("gitops", ns)
    assert dep.spec.template.spec.containers[0].args is None  # theirs, not the spec's
    pool.release("run")
    pool.scale_to_zero()


def test_two_overlapping_runs_share_the_pool_then_idle_ttl_scales_it_to_zero(
    kube: Kube, tmp_path: Path
) -> None:
    ns = kube.namespace()
    sp = spec(ns, tmp_path, idle_ttl_s=4, scaledown_ttl_s=2)
    a, b = KubernetesPool(kube.api, "pool", ns), KubernetesPool(kube.api, "pool", ns)  # two processes' view
    with ThreadPoolExecutor(2) as ex:  # both setups at once on a fresh pool: one creates, one finds it
        assert sorted(ex.map(lambda p: p.ensure(sp), (a, b))) == ["created", "unchanged"]
    assert a.acquire("dag/run-a", 2) == 2
    assert b.acquire("dag/run-b", 1) == 2  # run b rides on run a's workers
    a.wait_ready(2, timeout_s=90)
    first = {p.metadata.name for p in pods(kube, ns)}

    assert a.release("dag/run-a") == 2  # b wants 1: kept for scaledown_ttl, damping churn
    time.sleep(2.2)
    assert b.reconcile() == 1
    wait_for(lambda: len(pods(kube, ns)) == 1, what="one replica removed")

    assert b.release("dag/run-b") == 1  # idle: warm for idle_ttl
    dep = client.AppsV1Api(kube.api).read_namespaced_deployment("pool", ns)
    assert json.loads(dep.metadata.annotations[LEASES]) == {}
    # a back-to-back run within idle_ttl gets the warm worker: no new pod
    assert a.acquire("dag/run-c", 1) == 1
    assert {p.metadata.name for p in pods(kube, ns)} <= first
    assert a.release("dag/run-c") == 1
    assert a.reconcile() == 1  # not idle long enough yet
    time.sleep(4.2)
    assert a.reconcile() == 0  # what the reaper does
    wait_for(lambda: not pods(kube, ns), what="scaled to zero after idle_ttl")


def test_a_live_run_renews_its_lease_and_an_expired_one_does_not_pin_the_pool(
    kube: Kube, tmp_path: Path
) -> None:
    ns = kube.namespace()
    pool = KubernetesPool(kube.api, "pool", ns)
    pool.ensure(spec(ns, tmp_path, idle_ttl_s=0))
    assert pool.acquire("long-run", 1, ttl_s=1) == 1
    assert pool.acquire("crashed-run", 1, ttl_s=1) == 1  # its teardown never runs
    assert pool.renew("long-run", ttl_s=60)  # what each shard task of a live run does
    time.sleep(1.2)
    assert pool.reconcile() == 1 and not pool.renew("crashed-run")
    assert pool.release("long-run") == 0  # idle_ttl 0
    assert pool.status()["leases"] == {}


def test_a_pod_deleted_mid_job_is_replaced_and_its_job_resubmitted(
    kube: Kube, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ns = kube.namespace()
    pool = KubernetesPool(kube.api, "pool", ns)
    pool.ensure(spec(ns, tmp_path, engine_options={"approval_rate": 0.5, "latency_base_s": 0.5}))
    pool.acquire("run", 2)
    pool.wait_ready(2, timeout_s=90)
    src = dataset(tmp_path, 200)
    core = client.CoreV1Api(kube.api)
    victims: list[str] = []

    def busy_pod() -> str | None:
        for p in pods(kube, ns):
            url = f"http://{p.status.pod_ip}:{pool._pods()[1]}"
            try:
                with SyncWorkerClient(url, token=pool.token(), timeout=2) as c:
                    if c.stats().slots_busy:
                        return str(p.metadata.name)
            except Exception:
                continue
        return None

    async def scenario() -> dict[str, Any]:
        runner = asyncio.create_task(run(src, tmp_path / "run", pool, max_rounds=2, records_per_shard=20))
        while not victims:
            await asyncio.sleep(0.2)
            if (name := await asyncio.to_thread(busy_pod)) is not None:
                # a lost node / preemption: the pod goes at once, its process is killed
                await asyncio.to_thread(core.delete_namespaced_pod, name, ns, grace_period_seconds=0)
                victims.append(name)
        return await asyncio.wait_for(runner, 240)

    with caplog.at_level(logging.WARNING, logger="airflow_batchinfer.rpc"):
        summary = asyncio.run(scenario())
    assert any("lost on" in r.message and "resubmitting" in r.message for r in caplog.records)
    assert victims[0] not in {p.metadata.name for p in pods(kube, ns)}
    assert len(pool.endpoints()) == 2  # the Deployment replaced it
    assert summary["invariant"]["ok"], summary["invariant"]
    assert summary["failed_shards"] == []  # the lost job was resubmitted, no shard quarantined
    assert summary["approved"] + summary["remaining_pending"] == 200  # 0 lost
    approved = [
        r["id"] for f in JsonlDir(str(tmp_path / "run" / "results")).jsonl_files() for r in f.iter_records()
    ]
    assert len(approved) == len(set(approved)) == summary["approved"]
    pool.release("run")
    pool.scale_to_zero()


def test_cli_pool_up_status_down(kube: Kube, tmp_path: Path) -> None:
    ns = kube.namespace()
    env = {**os.environ, "KUBECONFIG": str(kube.plane.kubeconfig)}
    common = ["--backend", "kubernetes", "--name", "clipool", "--namespace", ns]

    def cli(*args: str) -> dict[str, Any]:
        out = subprocess.run(
            [BIN, "pool", *args, *common], capture_output=True, text=True, env=env, timeout=180
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return dict(json.loads(out.stdout))

    args = ["--engine", "simulated", "--replicas", "1", "--cpu", "1", "--memory", "1Gi", "--lease", "me",
            "--port", str(random.randint(20000, 40000)), "--allow-prefix", str(tmp_path)]  # fmt: skip
    # a CPU worker does not tolerate the GPU nodes' taint: the error says why, in the scheduler's words
    cpu = subprocess.run([BIN, "pool", "up", *args, "--gpus", "0", "--timeout", "5", *common],
                         capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert cpu.returncode == 1 and "0 of 1 workers ready" in cpu.stderr, cpu.stderr
    assert "not scheduled" in cpu.stderr and "taint" in cpu.stderr, cpu.stderr
    up = cli("up", *args, "--gpus", "1")  # same lease: its own settings may change
    assert up["deployment"] == "updated", up
    assert len(up["workers"]) == 1 and up["lease"] == "me"
    status = cli("status")
    assert status["ready"] == 1 and set(status["leases"]) == {"me"}
    down = subprocess.run([BIN, "pool", "down", "--now", *common], capture_output=True, text=True, env=env)
    assert down.returncode == 1 and "leased by ['me']" in down.stderr and "--force" in down.stderr
    assert cli("down", "--lease", "me")["replicas"] == 1  # released; warm for idle_ttl
    assert cli("down", "--force")["replicas"] == 0
    assert cli("down", "--delete")["deleted"] is True


# ------------------------------------------------------------------------------------------ helpers
def dataset(tmp_path: Path, n: int) -> Path:
    src = tmp_path / "data.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i:04d}", "question": f"q {i}"}) + "\n" for i in range(n)))
    return src


async def run(
    src: Path, root: Path, pool: KubernetesPool, *, max_rounds: int, records_per_shard: int = 10
) -> dict[str, Any]:
    cfg = RunConfig.of(
        input=str(src), run_root=str(root), prompt_template="{{ question }}", judge={"type": "llm"},
        max_rounds=max_rounds, records_per_shard=records_per_shard, chunk_size=10,
    )  # fmt: skip
    client_ = PoolClient(
        pool.endpoints(), token=pool.token(), discover=lambda: asyncio.to_thread(pool.endpoints),
        refresh_interval_s=1.0, poll_interval_s=0.2, lost_grace_s=2.0,
    )  # fmt: skip
    try:
        return await run_pipeline(cfg, client_)
    finally:
        await client_.aclose()
