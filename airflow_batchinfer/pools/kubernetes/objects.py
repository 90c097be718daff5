"""The Kubernetes objects of a worker pool, built from a :class:`KubernetesPoolSpec`.

One source for both paths: the pool manager creates these through the API, and
``batchinfer pool manifests`` prints them as YAML (``k8s/base/worker.yaml`` is that output for the
default spec, checked by a test).
"""

from __future__ import annotations

import copy
import json
from typing import Any

from airflow_batchinfer import __version__
from airflow_batchinfer.engines import secret_options
from airflow_batchinfer.pools.kubernetes.spec import (
    GPU_TOLERATION,
    MODEL_CACHE_MOUNT,
    SPOT_TOLERATIONS,
    KubernetesPoolSpec,
)
from airflow_batchinfer.worker.settings import TOKEN_ENV, worker_argv, worker_env

ANNOTATION = "batchinfer.io/"
SPEC_HASH = ANNOTATION + "spec-hash"
MANAGED_BY = {"app.kubernetes.io/managed-by": "airflow-batchinfer"}


def selector(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "batchinfer-worker", "app.kubernetes.io/instance": name}


def labels(name: str) -> dict[str, str]:
    return {**selector(name), **MANAGED_BY, "app.kubernetes.io/version": __version__}


def _meta(spec: KubernetesPoolSpec, name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": spec.namespace, "labels": labels(spec.name), **extra}


def _args(spec: KubernetesPoolSpec) -> list[str]:
    """The engine options, the one worker setting without a variable, as the worker's flags."""
    return worker_argv({"engine_options": dict(sorted(spec.engine_options.items()))}, joined=True)


def _resources(spec: KubernetesPoolSpec) -> dict[str, Any]:
    requests = {"cpu": spec.cpu, "memory": spec.memory}
    limits = {"memory": spec.memory}  # no CPU limit: throttling a tokenizer helps nobody
    if spec.gpus:
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = str(spec.gpus)
    return {"requests": requests, "limits": limits}


def _volumes(spec: KubernetesPoolSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The root filesystem is read-only: scratch, caches and shared memory are volumes."""
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {}}]
    mounts: list[dict[str, Any]] = [{"name": "tmp", "mountPath": "/tmp"}]
    if spec.gpus:  # vLLM and NCCL use /dev/shm; the container default is 64 MiB
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    if spec.model_pvc:
        volumes.append(
            {"name": "models", "persistentVolumeClaim": {"claimName": spec.model_pvc, "readOnly": True}}
        )
        mounts.append({"name": "models", "mountPath": "/models", "readOnly": True})
    if spec.model_cache:
        if "pvc" in spec.model_cache:
            source: dict[str, Any] = {
                "persistentVolumeClaim": {"claimName": spec.model_cache["pvc"], "readOnly": True}
            }
        else:  # a node without the cache starts too (an empty dir): its worker loads `model`
            source = {"hostPath": {"path": spec.model_cache["host_path"], "type": "DirectoryOrCreate"}}
        volumes.append({"name": "model-cache", **source})
        mounts.append({"name": "model-cache", "mountPath": MODEL_CACHE_MOUNT, "readOnly": True})
    return volumes, mounts


def _engine_secret_env(spec: KubernetesPoolSpec) -> list[dict[str, Any]]:
    """Each secret engine option as the engine's own variable (``OPENAI_API_KEY``) from the key of the
    option's name in ``engine_secret``: the Deployment (readable with the ``view`` role) names the
    Secret, never a value. A required option's key must exist (else the pod does not start)."""
    if not spec.engine_secret:
        return []
    env: list[dict[str, Any]] = []
    for o in secret_options(spec.engine).values():
        ref = {"name": spec.engine_secret, "key": o.name, **({} if o.required else {"optional": True})}
        env.append({"name": o.env, "valueFrom": {"secretKeyRef": ref}})
    return env


def _env(spec: KubernetesPoolSpec) -> list[dict[str, Any]]:
    """Settings as the worker's variables (``BATCHINFER_WORKER_*``, :func:`worker_env`), so a kustomize
    patch can change any one by name.

    The user's ``env`` comes first: for a repeated name the container gets the later entry, so the
    worker's own (token, allow-lists, bind address) win even over a name the spec check missed. The
    trust settings are all set, off ones included (``ALLOW_ANY_PREFIX=0``, ``ALLOW_CALLABLE=""``,
    ``TOKEN_FILE=""``): ``env`` beats ``envFrom``, so a key of the storage Secret cannot set them."""
    settings = {
        "host": "$(POD_IP)",
        "port": spec.port,
        "engine": spec.engine,
        "model": spec.model,
        "concurrency": spec.concurrency,
        "target_batch_tokens": spec.target_batch_tokens,
        "drain_timeout_s": spec.drain_timeout_s,
        "allowed_prefixes": spec.allowed_prefixes,
        "allow_any_prefix": False,
        "allowed_callables": spec.allowed_callables,
        "allowed_adapters": spec.allowed_adapters,
        "token_file": "",
        "model_cache_dir": MODEL_CACHE_MOUNT if spec.model_cache else None,
    }
    worker = worker_env(settings)
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(spec.env.items())]
    env += [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        *({"name": k, "value": v} for k, v in worker.items()),
        {"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": spec.token_secret, "key": "token"}}},
        *_engine_secret_env(spec),
        {"name": "HOME", "value": "/tmp"},
        # Models come from the image or the model volume; nothing is downloaded at run time.
        {"name": "HF_HUB_OFFLINE", "value": "1"},
        {"name": "OMP_NUM_THREADS", "value": spec.cpu if spec.cpu.isdigit() else "1"},
    ]
    return env


def worker_deployment(spec: KubernetesPoolSpec, *, replicas: int = 0) -> dict[str, Any]:
    volumes, mounts = _volumes(spec)
    tolerations = list(spec.tolerations)
    if spec.gpus:
        tolerations.append(GPU_TOLERATION)
    if spec.interruptible:
        tolerations += SPOT_TOLERATIONS
    container: dict[str, Any] = {
        "name": "worker",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["batchinfer", "worker", "serve"],
        "env": _env(spec),
        "ports": [{"name": "rpc", "containerPort": spec.port, "protocol": "TCP"}],
        # Ready once the model is loaded; not ready while draining, so no new jobs arrive.
        "readinessProbe": {
            "httpGet": {"path": "/v1/ready", "port": "rpc"},
            "periodSeconds": 5,
            "failureThreshold": 2,
        },
        # Loading a large model takes minutes; the health endpoint answers meanwhile.
        "livenessProbe": {
            "httpGet": {"path": "/v1/health", "port": "rpc"},
            "initialDelaySeconds": 30,
            "periodSeconds": 15,
            "failureThreshold": 4,
        },
        "resources": _resources(spec),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": mounts,
    }
    if spec.engine_options:
        container["args"] = _args(spec)
    if spec.storage_secret:
        container["envFrom"] = [{"secretRef": {"name": spec.storage_secret}}]
    pod_spec: dict[str, Any] = {
        # Workers never talk to the Kubernetes API: no token, whatever the service account. IRSA and
        # Workload Identity still work (their webhook or metadata server gives the cloud credential).
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        # SIGTERM drains: running jobs finish (in-place jobs checkpoint) before the pod goes.
        "terminationGracePeriodSeconds": spec.drain_timeout_s + 30,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "fsGroup": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }
    if spec.service_account:
        pod_spec["serviceAccountName"] = spec.service_account
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in spec.image_pull_secrets]
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if tolerations:
        pod_spec["tolerations"] = tolerations
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(spec, spec.name, annotations={SPEC_HASH: spec.key()}),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector(spec.name)},
            # Replace one worker at a time, without a surge pod that would need a spare GPU.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": {"metadata": {"labels": selector(spec.name)}, "spec": pod_spec},
        },
    }


# Pod settings a spec may leave out (``serviceAccount``: the API's old alias of ``serviceAccountName``,
# which it fills in and reads back when the new name is missing).
OPTIONAL_POD_FIELDS = (
    "serviceAccountName",
    "serviceAccount",
    "imagePullSecrets",
    "nodeSelector",
    "tolerations",
)


def template_patch(spec: KubernetesPoolSpec) -> dict[str, Any]:
    """The pod template as a merge patch (RFC 7386) over an older one: that keeps every key it does not
    name, so the optional settings this spec leaves out are named as ``null`` (removed); a pool that
    drops its ``service_account`` must not keep running under it."""
    template: dict[str, Any] = worker_deployment(spec)["spec"]["template"]
    for key in OPTIONAL_POD_FIELDS:
        template["spec"].setdefault(key, None)
    return template


def worker_service(spec: KubernetesPoolSpec) -> dict[str, Any]:
    """Headless: clients talk to each worker (least-loaded choice), never through a balancer."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(spec, spec.name),
        "spec": {
            "clusterIP": "None",
            "selector": selector(spec.name),
            "ports": [{"name": "rpc", "port": spec.port, "targetPort": "rpc", "protocol": "TCP"}],
        },
    }


def disruption_budget(spec: KubernetesPoolSpec) -> dict[str, Any]:
    """Node drains take one worker at a time; it drains its jobs first."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(spec, spec.name),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(spec.name)}},
    }


def token_secret(spec: KubernetesPoolSpec, token: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": _meta(spec, spec.token_secret),
        "stringData": {"token": token},
    }


def network_policy_name(pool: str) -> str:
    return f"{pool}-rpc"


def network_policy(spec: KubernetesPoolSpec) -> dict[str, Any]:
    """Only Airflow's pods (``rpc_from``, in ``rpc_from_namespace``) reach this pool's RPC port; other
    ingress to its pods is dropped (kubelet probes are not affected). Enforced by a network plugin
    that implements NetworkPolicy (Calico, Cilium...)."""
    peer: dict[str, Any] = {"podSelector": copy.deepcopy(spec.rpc_from)}
    if spec.rpc_from_namespace and spec.rpc_from_namespace != spec.namespace:
        # ONE peer with both selectors: those pods in that namespace (two peers would admit either)
        peer["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": spec.rpc_from_namespace}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(spec, network_policy_name(spec.name)),
        "spec": {
            "podSelector": {"matchLabels": selector(spec.name)},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [peer], "ports": [{"protocol": "TCP", "port": spec.port}]}],
        },
    }


def pool_objects(spec: KubernetesPoolSpec, *, network: bool = True) -> list[dict[str, Any]]:
    """Everything but the token Secret (it is made once, from a fresh random token). ``network``: with
    the pool's NetworkPolicy (k8s/base ships its own, for every pool of the namespace)."""
    objs = [worker_deployment(spec), worker_service(spec), disruption_budget(spec)]
    return [*objs, network_policy(spec)] if network else objs


def to_yaml(objects: list[dict[str, Any]], *, namespace: bool = True) -> str:
    import yaml

    docs = []
    for obj in objects:
        obj = json.loads(json.dumps(obj))
        if not namespace:
            obj["metadata"].pop("namespace", None)
        docs.append(yaml.safe_dump(obj, sort_keys=False, width=110))
    return "---\n".join(docs)
