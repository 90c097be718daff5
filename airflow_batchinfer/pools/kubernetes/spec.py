"""What a Kubernetes worker pool runs: one spec, hashed onto the Deployment it becomes."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from airflow_batchinfer import __version__
from airflow_batchinfer.exceptions import ConfigError, check_known_fields

# What the Dockerfile in k8s/ builds; push it to your registry and set `image`.
DEFAULT_IMAGE = f"airflow-batchinfer-worker:{__version__}"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

# Taints that the common providers put on spot/preemptible nodes; `interruptible` tolerates them.
SPOT_TOLERATIONS: tuple[dict[str, str], ...] = (
    {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
    {"key": "kubernetes.azure.com/scalesetpriority", "operator": "Equal", "value": "spot",
     "effect": "NoSchedule"},
    {"key": "eks.amazonaws.com/capacityType", "operator": "Equal", "value": "SPOT", "effect": "NoSchedule"},
    {"key": "batchinfer.io/interruptible", "operator": "Exists", "effect": "NoSchedule"},
)  # fmt: skip
DEFAULT_IDLE_TTL_S = 600.0
DEFAULT_SCALEDOWN_TTL_S = 120.0
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@dataclass(frozen=True)
class KubernetesPoolSpec:
    """What a Kubernetes worker pool runs.

    :param name: the pool; the Deployment, headless Service, PodDisruptionBudget and the token
        Secret (``<name>-token``) are named after it.
    :param replicas: workers this run needs.
    :param gpus: ``nvidia.com/gpu`` per worker (0: a CPU pool).
    :param model: a path inside the container (a model volume, ``model_pvc``, is mounted read-only
        at ``/models``).
    :param idle_ttl_s: scale to zero once no run has held a lease for this long.
    :param scaledown_ttl_s: demand must stay below the replica count this long before a replica goes.
    :param interruptible: tolerate spot/preemptible node taints (jobs lost there are resubmitted).
    """

    name: str = "batchinfer"
    namespace: str = "default"
    image: str = DEFAULT_IMAGE
    image_pull_policy: str = "IfNotPresent"
    engine: str = "vllm"
    model: str | None = None
    engine_options: dict[str, Any] = field(default_factory=dict)
    replicas: int = 1
    concurrency: int = 8
    target_batch_tokens: int = 16_384
    allowed_prefixes: tuple[str, ...] = ()
    gpus: int = 1
    cpu: str = "4"
    memory: str = "32Gi"
    shm_size: str = "8Gi"
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    interruptible: bool = False
    model_pvc: str | None = None
    storage_secret: str | None = None  # envFrom: e.g. AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY
    env: dict[str, str] = field(default_factory=dict)
    port: int = 8000
    drain_timeout_s: int = 300
    idle_ttl_s: float = DEFAULT_IDLE_TTL_S
    scaledown_ttl_s: float = DEFAULT_SCALEDOWN_TTL_S

    def __post_init__(self) -> None:
        for what, value in (("name", self.name), ("namespace", self.namespace)):
            if len(value) > 48 or not _DNS_LABEL.match(value):
                raise ConfigError(
                    f"pool {what} {value!r}: use at most 48 lowercase letters, digits and '-' "
                    "(a Kubernetes DNS label)"
                )
        if self.replicas < 0 or self.concurrency < 1 or self.gpus < 0:
            raise ConfigError("replicas must be >= 0, concurrency >= 1 and gpus >= 0")
        if not self.allowed_prefixes:
            raise ConfigError(
                "a Kubernetes pool needs allowed_prefixes: the storage locations its jobs use (s3://bucket/runs/)"
            )
        if self.idle_ttl_s < 0 or self.scaledown_ttl_s < 0:
            raise ConfigError("idle_ttl_s and scaledown_ttl_s must be >= 0")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KubernetesPoolSpec:
        check_known_fields(cls, data, "Kubernetes pool settings")
        data = dict(data)
        for key in ("allowed_prefixes", "tolerations"):
            if key in data:
                data[key] = tuple(data[key] or ())
        return cls(**data)

    def key(self) -> str:
        """What the workers run: changes replace the pods. Scale and lifecycle settings are not in it."""
        data = dataclasses.asdict(self)
        for k in ("replicas", "idle_ttl_s", "scaledown_ttl_s"):
            data.pop(k)
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]

    @property
    def token_secret(self) -> str:
        return f"{self.name}-token"
