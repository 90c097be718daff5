"""Kubernetes pool benchmark (printed, not asserted), SIMULATED engine, on a local control plane with
the test suite's kubelet stand-in running pods as local processes. The control plane is found as the
Kubernetes tests find it (:mod:`airflow_batchinfer.dev.kube_plane`): ``$BATCHINFER_TEST_K8S_BIN`` (etcd,
kube-apiserver, kube-controller-manager, kube-scheduler), ``$KUBEBUILDER_ASSETS`` (not enough here:
envtest has no controller-manager or scheduler), or the workplace's tool.

Side by side in one run:

- time to N ready workers: a cold Kubernetes pool (0 → N: API, ReplicaSet controller, scheduler,
  process start, readiness probe) and a warm one (a back-to-back run's lease within ``idle_ttl``),
  against the local pool cold and warm;
- worker discovery through the API (list the Deployment's pods), per call;
- a round with one pod force-deleted mid-run (a lost node) against the same round undisturbed:
  wall time, jobs resubmitted, records lost.

With a real model, model loading dominates cold starts; this measures what the pool adds.
Run: ``python bench/kubernetes_pool.py [--replicas 4 --records 400]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from airflow_batchinfer.dev.kube_plane import (  # noqa: E402
    NEEDS_CONTROLLERS,
    NO_CONTROL_PLANE,
    find_control_plane,
    start_control_plane,
)
from airflow_batchinfer.dev.kubelet import Kubelet  # noqa: E402
from airflow_batchinfer.pools import LocalPool, LocalPoolSpec  # noqa: E402
from airflow_batchinfer.pools.kubernetes import KubernetesPool, KubernetesPoolSpec  # noqa: E402
from airflow_batchinfer.rpc.client import SyncWorkerClient  # noqa: E402
from airflow_batchinfer.rpc.pool import PoolClient  # noqa: E402
from airflow_batchinfer.run.pipeline import run_pipeline  # noqa: E402
from airflow_batchinfer.state.config import RunConfig  # noqa: E402


class Resubmits(logging.Handler):
    count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "resubmitting" in record.getMessage():
            Resubmits.count += 1


def timed(fn: Any) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


async def a_round(
    pool: KubernetesPool, src: Path, root: Path, kill: Any = None
) -> tuple[float, dict[str, Any]]:
    cfg = RunConfig.of(input=str(src), run_root=str(root), prompt_template="{{ q }}", judge={"type": "llm"},
                       max_rounds=1, records_per_shard=20, chunk_size=10)  # fmt: skip
    client = PoolClient(
        pool.endpoints(), token=pool.token(), discover=lambda: asyncio.to_thread(pool.endpoints),
        refresh_interval_s=1.0, poll_interval_s=0.2, lost_grace_s=2.0,
    )  # fmt: skip
    t = time.perf_counter()
    try:
        task = asyncio.create_task(run_pipeline(cfg, client))
        if kill is not None:
            await kill()
        summary = await task
    finally:
        await client.aclose()
    return time.perf_counter() - t, summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--records", type=int, default=400)
    args = ap.parse_args()
    found = find_control_plane()
    if found is None or not found.controllers:
        why = NO_CONTROL_PLANE if found is None else NEEDS_CONTROLLERS.format(source=found.source)
        print(f"kubernetes_pool: skipped: {why}")
        return
    logging.getLogger("airflow_batchinfer.rpc").addHandler(Resubmits())
    work = Path(tempfile.mkdtemp(prefix="bi-k8s-bench-"))
    plane = start_control_plane(work / "cp", found)
    api = plane.api()
    kubelet = Kubelet(api, work / "kubelet", bin_dir=Path(sys.executable).parent).start()
    results: dict[str, Any] = {}
    try:
        from kubernetes import client

        client.CoreV1Api(api).create_namespace({"metadata": {"name": "bench"}})
        time.sleep(1)
        spec = KubernetesPoolSpec(
            name="bench", namespace="bench", engine="simulated", engine_options={"latency_base_s": 1.0},
            concurrency=2, gpus=1, cpu="1", memory="1Gi", port=random.randint(20000, 40000),
            allowed_prefixes=(str(work),), drain_timeout_s=5, idle_ttl_s=600,
        )  # fmt: skip
        pool = KubernetesPool(api, "bench", "bench")
        pool.ensure(spec)
        pool.acquire("cold", args.replicas)
        results["k8s_cold_s"], _ = timed(lambda: pool.wait_ready(args.replicas, timeout_s=300))
        pool.release("cold")
        results["k8s_warm_s"], _ = timed(lambda: (pool.acquire("warm", args.replicas),
                                                  pool.wait_ready(args.replicas, timeout_s=60)))  # fmt: skip
        calls = [timed(pool.endpoints)[0] for _ in range(30)]
        results["discovery_ms_median"] = round(1000 * statistics.median(calls), 1)

        local = LocalPool("bench", state_dir=work / "local")
        lspec = LocalPoolSpec(engine="simulated", replicas=args.replicas, concurrency=2, idle_ttl_s=600,
                              allowed_prefixes=(str(work),))  # fmt: skip
        results["local_cold_s"], _ = timed(lambda: local.up(lspec))
        results["local_warm_s"], _ = timed(lambda: local.up(lspec))
        local.down()

        src = work / "data.jsonl"
        src.write_text("".join(json.dumps({"id": f"r{i}", "q": f"q{i}"}) + "\n" for i in range(args.records)))
        base_s, base = asyncio.run(a_round(pool, src, work / "run-calm"))

        killed: list[str] = []

        async def kill_one() -> None:
            """Force-delete a pod while it runs a job (a lost node)."""
            while not killed:
                await asyncio.sleep(0.2)
                for p in await asyncio.to_thread(
                    lambda: client.CoreV1Api(api).list_namespaced_pod("bench").items
                ):
                    with SyncWorkerClient(
                        f"http://{p.status.pod_ip}:{spec.port}", token=pool.token(), timeout=2
                    ) as c:
                        if not c.stats().slots_busy:
                            continue
                    client.CoreV1Api(api).delete_namespaced_pod(
                        p.metadata.name, "bench", grace_period_seconds=0
                    )
                    killed.append(p.metadata.name)
                    return

        Resubmits.count = 0
        lost_s, lost = asyncio.run(a_round(pool, src, work / "run-lost", kill_one))
        results.update(
            round_calm_s=base_s, round_pod_lost_s=lost_s, pods_killed=len(killed),
            resubmitted_jobs=Resubmits.count,
            records_lost=args.records - (lost["approved"] + lost["remaining_pending"]),
            invariant_ok=bool(lost["invariant"]["ok"] and base["invariant"]["ok"]),
        )  # fmt: skip
        pool.release("warm")
        pool.scale_to_zero()
    finally:
        kubelet.stop()
        plane.stop()
        shutil.rmtree(work, ignore_errors=True)

    r = {k: round(v, 2) if isinstance(v, float) else v for k, v in results.items()}
    print(f"\nworkers ready ({args.replicas} replicas, simulated engine: no model load)")
    print(f"  {'':12} {'cold':>8} {'warm':>8}")
    print(f"  {'kubernetes':12} {r['k8s_cold_s']:>7}s {r['k8s_warm_s']:>7}s")
    print(f"  {'local':12} {r['local_cold_s']:>7}s {r['local_warm_s']:>7}s")
    print(f"worker discovery through the API: {r['discovery_ms_median']} ms median per call")
    print(f"one round, {args.records} records / 20 per shard, {args.replicas} workers x 2 slots:")
    print(f"  undisturbed {r['round_calm_s']}s; one pod force-deleted mid-round {r['round_pod_lost_s']}s")
    ok = "ok" if r["invariant_ok"] else "FAILED"
    print(f"  ({r['pods_killed']} pod killed, {r['resubmitted_jobs']} jobs resubmitted, "
          f"{r['records_lost']} records lost, invariant {ok})")  # fmt: skip
    print(json.dumps({"bench": "kubernetes_pool", **r}))


if __name__ == "__main__":
    main()
