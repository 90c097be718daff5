"""``batchinfer pool … --backend kubernetes``: the same pool manager the Airflow tasks use."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import getpass
import json
import socket
from typing import TYPE_CHECKING, Any

from airflow_batchinfer.pools.kubernetes.objects import MANAGED_BY, SPEC_HASH, pool_objects, to_yaml
from airflow_batchinfer.pools.kubernetes.spec import DEFAULT_IMAGE, DEFAULT_RPC_FROM, KubernetesPoolSpec

if TYPE_CHECKING:
    from airflow_batchinfer.pools.kubernetes.manager import KubernetesPool


def add_arguments(p: argparse.ArgumentParser, *, spec: bool) -> None:
    """The Kubernetes-only flags, with the spec's defaults (the workers' settings: ``pool up``'s own)."""
    default = {f.name: f.default for f in dataclasses.fields(KubernetesPoolSpec)}
    g = p.add_argument_group("kubernetes backend")
    g.add_argument("--namespace", default="default")
    g.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG, ~/.kube/config or in-cluster")
    g.add_argument("--context", default=None)
    if not spec:
        return
    g.add_argument("--image", default=DEFAULT_IMAGE, help="the worker image (k8s/Dockerfile)")
    g.add_argument("--gpus", type=int, default=default["gpus"], help="nvidia.com/gpu per worker (0: CPU)")
    g.add_argument("--cpu", default=default["cpu"])
    g.add_argument("--memory", default=default["memory"])
    g.add_argument("--node-selector", action="append", default=[], metavar="KEY=VALUE")
    g.add_argument("--interruptible", action="store_true", help="tolerate spot/preemptible nodes")
    g.add_argument("--model-pvc", default=None, help="PersistentVolumeClaim mounted read-only at /models")
    cache = g.add_mutually_exclusive_group()
    cache.add_argument(
        "--model-cache-host-path",
        default=None,
        metavar="DIR",
        help="a node directory of pre-staged models, mounted read-only at /model-cache (model_cache)",
    )
    cache.add_argument(
        "--model-cache-pvc",
        default=None,
        metavar="CLAIM",
        help="a PersistentVolumeClaim of pre-staged models, mounted read-only at /model-cache",
    )
    g.add_argument("--storage-secret", default=None, help="Secret with storage credentials (env)")
    g.add_argument(
        "--engine-secret",
        default=None,
        help="Secret with the engine's secret options, one key each (api_key, default_headers)",
    )
    g.add_argument(
        "--service-account",
        default=None,
        help="the worker pods' ServiceAccount (storage access by IRSA or Workload Identity)",
    )
    g.add_argument(
        "--image-pull-secret",
        action="append",
        default=[],
        metavar="SECRET",
        help="Secret to pull the image from a private registry (repeatable)",
    )
    g.add_argument("--port", type=int, default=default["port"])
    g.add_argument(
        "--rpc-from",
        type=json.loads,
        default=None,
        metavar="JSON",
        help="label selector of the Airflow pods that may call the workers (the NetworkPolicy; "
        "default: the Helm chart's worker, triggerer, scheduler and api-server)",
    )
    g.add_argument(
        "--rpc-from-namespace",
        default=None,
        metavar="NAMESPACE",
        help="the namespace those pods run in (default: the pool's)",
    )
    g.add_argument(
        "--scaledown-ttl",
        type=float,
        default=default["scaledown_ttl_s"],
        help="seconds of lower demand before a replica goes",
    )
    g.add_argument("--lease", default=None, help="lease id this command holds (default cli:USER@HOST)")
    g.add_argument("--lease-ttl", type=float, default=12 * 3600, help="the lease lapses after this long")
    g.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for ready workers")


def _pool(args: argparse.Namespace) -> KubernetesPool:
    from airflow_batchinfer.pools.kubernetes.manager import KubernetesPool, api_client

    return KubernetesPool(api_client(args.kubeconfig, args.context), args.name, args.namespace)


def open_cli_pool(args: argparse.Namespace) -> KubernetesPool:
    """The pool the command's flags name (``pool metrics`` asks its workers itself)."""
    return _pool(args)


def _lease(args: argparse.Namespace) -> str:
    return args.lease or f"cli:{getpass.getuser()}@{socket.gethostname()}"


def spec_from_args(args: argparse.Namespace) -> KubernetesPoolSpec:
    from airflow_batchinfer.worker.settings import parse_options

    return KubernetesPoolSpec(
        name=args.name,
        namespace=args.namespace,
        image=args.image,
        engine=args.engine,
        model=args.model,
        engine_options=parse_options(args.engine_arg),
        replicas=args.replicas,
        concurrency=args.concurrency,
        target_batch_tokens=args.target_batch_tokens,
        allowed_prefixes=tuple(args.allow_prefix),
        gpus=args.gpus,
        cpu=args.cpu,
        memory=args.memory,
        node_selector=dict(kv.split("=", 1) for kv in args.node_selector),
        interruptible=args.interruptible,
        model_pvc=args.model_pvc,
        model_cache=(
            {"host_path": args.model_cache_host_path}
            if args.model_cache_host_path
            else {"pvc": args.model_cache_pvc}
            if args.model_cache_pvc
            else None
        ),
        storage_secret=args.storage_secret,
        engine_secret=args.engine_secret,
        service_account=args.service_account,
        image_pull_secrets=tuple(args.image_pull_secret),
        port=args.port,
        idle_ttl_s=args.idle_ttl,
        scaledown_ttl_s=args.scaledown_ttl,
        allowed_callables=tuple(args.allow_callable),
        allowed_adapters=tuple(args.allow_adapter),
        rpc_from=args.rpc_from or copy.deepcopy(DEFAULT_RPC_FROM),
        rpc_from_namespace=args.rpc_from_namespace,
    )


def up(args: argparse.Namespace) -> dict[str, Any]:
    spec = spec_from_args(args)
    pool = _pool(args)
    deployment = pool.ensure(spec, lease_id=_lease(args))
    pool.acquire(_lease(args), spec.replicas, ttl_s=args.lease_ttl)
    urls = pool.wait_ready(spec.replicas, timeout_s=args.timeout)
    return {
        "pool": f"kubernetes://{spec.namespace}/{spec.name}",
        "deployment": deployment,
        "lease": _lease(args),
        "workers": urls,
        "token_secret": spec.token_secret,
    }


def status(args: argparse.Namespace) -> dict[str, Any]:
    return _pool(args).status()


def down(args: argparse.Namespace) -> dict[str, Any]:
    """Release this CLI's lease; ``--force`` scales to zero even under other leases; ``--delete``
    removes the pool's objects."""
    pool = _pool(args)
    if args.delete:
        pool.delete()
        return {"pool": str(pool), "deleted": True}
    replicas = pool.release(_lease(args))
    if replicas and (args.force or args.now):
        replicas = pool.scale_to_zero(force=args.force)
    return {"pool": str(pool), "replicas": replicas}


def reap(args: argparse.Namespace) -> dict[str, Any]:
    """Apply idle_ttl / scaledown_ttl / lease expiry to every pool this package manages in the
    namespace (the reaper CronJob in k8s/ runs this)."""
    from kubernetes import client

    from airflow_batchinfer.pools.kubernetes.manager import KubernetesPool, api_client

    api = api_client(args.kubeconfig, args.context)
    sel = ",".join(f"{k}={v}" for k, v in MANAGED_BY.items())
    deps = client.AppsV1Api(api).list_namespaced_deployment(args.namespace, label_selector=sel).items
    return {d.metadata.name: KubernetesPool(api, d.metadata.name, args.namespace).reconcile() for d in deps}


def manifests(args: argparse.Namespace) -> None:
    """The pool's objects for ``kubectl apply`` / GitOps. They carry no spec hash, so the pool
    manager adopts them: Airflow leases and scales the Deployment and never edits its template."""
    objs = pool_objects(spec_from_args(args), network=not getattr(args, "no_network_policy", False))
    for obj in objs:
        annotations = obj["metadata"].pop("annotations", {})
        annotations.pop(SPEC_HASH, None)
        if annotations:
            obj["metadata"]["annotations"] = annotations
    print(to_yaml(objs, namespace=not args.no_namespace), end="")
