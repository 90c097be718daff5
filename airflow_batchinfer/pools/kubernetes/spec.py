"""What a Kubernetes worker pool runs: one spec, hashed onto the Deployment it becomes."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from airflow_batchinfer import __version__
from airflow_batchinfer.engines import check_no_secrets, secret_options
from airflow_batchinfer.exceptions import ConfigError, check_known_fields
from airflow_batchinfer.worker.settings import ENV_PREFIX, POOL_IDLE_TTL_S, worker_default

# What the Dockerfile in k8s/ builds; push it to your registry and set `image`.
DEFAULT_IMAGE = f"airflow-batchinfer-worker:{__version__}"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# ServiceAccount and Secret names: DNS subdomains (RFC 1123), at most 253 characters
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # a C identifier, ASCII only (POSIX shells read these)

# Names of user `env` that the worker's container sets itself, and why: refused when a spec is built.
# (In a container's env the later entry of a name wins; objects.py emits the user's entries first, so
# ours would win anyway, but an entry silently ignored is worse than an error.) Every
# `BATCHINFER_WORKER_*` name (worker.settings.ENV_PREFIX) is the worker's: its settings, the RPC
# token (..._TOKEN, ..._TOKEN_FILE) and the allow-lists (..._ALLOW_PREFIX, ..._ALLOW_ANY_PREFIX,
# ..._ALLOW_CALLABLE) come from the spec's fields, never from `env`.
RESERVED_ENV: dict[str, str] = {
    "POD_IP": "the worker binds the pod IP it names (BATCHINFER_WORKER_HOST=$(POD_IP))",
    "HF_HUB_OFFLINE": "workers never download models or model code at run time",
    "HOME": "it is /tmp: the root filesystem is read-only",
    "OMP_NUM_THREADS": "it is set from `cpu`",
}

# The fields a trigger's `kubernetes` param may set (operators/pool.py merges that param into the spec
# last): where the pods run and with what resources. Not what the pool is (name, namespace: another
# pool, another namespace's Secrets), what it runs or how hard (engine, model, engine_options,
# concurrency, target_batch_tokens: DAG settings with params of their own), what jobs may do there
# (allowed_prefixes, allowed_callables, allowed_adapters: the trust boundary the pool enforces; rpc_from,
# rpc_from_namespace: who may call it), or its scale and idle time (replicas, idle_ttl_s: params of
# their own). The port may change: the pool's NetworkPolicy follows it (k8s/base's admits only its
# own port, so another one makes such a pool unreachable, not open). `image`, `storage_secret`,
# `engine_secret`, `model_pvc`, `service_account` and `image_pull_secrets` must be on the
# deployment's allow-lists (airflow_batchinfer.spec.limits).
TRIGGER_KEYS: frozenset[str] = frozenset(
    {
        "image",
        "image_pull_policy",
        "gpus",
        "cpu",
        "memory",
        "shm_size",
        "node_selector",
        "tolerations",
        "interruptible",
        "model_pvc",
        "storage_secret",
        "engine_secret",
        "env",
        "drain_timeout_s",
        "scaledown_ttl_s",
        "port",
        "service_account",
        "image_pull_secrets",
    }
)

# Taints that the common providers put on spot/preemptible nodes; `interruptible` tolerates them.
SPOT_TOLERATIONS: tuple[dict[str, str], ...] = (
    {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
    {"key": "kubernetes.azure.com/scalesetpriority", "operator": "Equal", "value": "spot",
     "effect": "NoSchedule"},
    {"key": "eks.amazonaws.com/capacityType", "operator": "Equal", "value": "SPOT", "effect": "NoSchedule"},
    {"key": "batchinfer.io/interruptible", "operator": "Exists", "effect": "NoSchedule"},
)  # fmt: skip
# The pods of the official Airflow Helm chart that call workers (as k8s/base/networkpolicy.yaml):
# task processes (worker), triggers (triggerer), LocalExecutor tasks (scheduler), the Test button
# (api-server). A Kubernetes LabelSelector.
DEFAULT_RPC_FROM: dict[str, Any] = {
    "matchLabels": {"tier": "airflow"},
    "matchExpressions": [
        {"key": "component", "operator": "In", "values": ["worker", "triggerer", "scheduler", "api-server"]}
    ],
}
DEFAULT_SCALEDOWN_TTL_S = 120.0
# Where a pool's ``model_cache`` volume is mounted (read-only) in the worker container; the worker's
# model_cache_dir setting names it.
MODEL_CACHE_MOUNT = "/model-cache"
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
    :param model_cache: a node-local volume of pre-staged models, mounted read-only at
        ``/model-cache``: ``{"host_path": "/var/cache/batchinfer-models"}`` (a directory on each
        node, filled by a DaemonSet) or ``{"pvc": "NAME"}`` (a claim with the models copied in). A
        worker loads ``/model-cache/<the model's directory name>`` when it holds a complete copy
        (``config.json``), else ``model``. A DAG setting only: a trigger cannot mount a host path.
    :param allowed_callables: the ``callable`` judges (``module:function``) the workers may run
        (``BATCHINFER_WORKER_ALLOW_CALLABLE``); none by default.
    :param allowed_adapters: LoRA adapter directories in the container (a ``model_pvc`` at
        ``/models``) the workers may load besides those inside ``allowed_prefixes``; none by default.
    :param env: extra variables for the worker container; names must be C identifiers, and none of
        the worker's own (``BATCHINFER_WORKER_*``, ``POD_IP``, ``HOME``, ``HF_HUB_OFFLINE``,
        ``OMP_NUM_THREADS``).
    :param service_account: the worker pods' ``serviceAccountName`` (it must exist in the namespace):
        the identity a cloud gives storage access to (EKS IRSA, GKE Workload Identity), instead of a
        ``storage_secret``. No API token is mounted (``automountServiceAccountToken: false``): the
        workers never call the Kubernetes API. ``None``: the namespace's ``default``.
    :param image_pull_secrets: Secrets (``kubernetes.io/dockerconfigjson``, in the namespace) the
        kubelet pulls ``image`` with, for a private registry.
    :param engine_secret: a Secret holding the engine's secret options (``api_key``,
        ``default_headers`` of the ``openai`` engine), one key per option: each reaches the worker as
        the engine's variable (``OPENAI_API_KEY``) through ``secretKeyRef``, never as an argument.
    """

    name: str = "batchinfer"
    namespace: str = "default"
    image: str = DEFAULT_IMAGE
    image_pull_policy: str = "IfNotPresent"
    # Not the workers' defaults (worker.settings), on purpose: a GPU Deployment of the vLLM image
    # (k8s/Dockerfile), not the simulated engine, with the slots that keep vLLM's batches full. These
    # defaults are in the spec key of pools already running: changing one would replace their pods.
    # The other worker settings default to the workers' own.
    engine: str = "vllm"
    model: str | None = worker_default("model")
    engine_options: dict[str, Any] = field(default_factory=dict)
    replicas: int = 1
    concurrency: int = 8
    target_batch_tokens: int = worker_default("target_batch_tokens")
    allowed_prefixes: tuple[str, ...] = ()
    allowed_callables: tuple[str, ...] = ()  # callable judges the workers may run: "module:function"
    allowed_adapters: tuple[str, ...] = ()  # LoRA adapter directories the workers may load (read only)
    gpus: int = 1
    cpu: str = "4"
    memory: str = "32Gi"
    shm_size: str = "8Gi"
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    interruptible: bool = False
    model_pvc: str | None = None
    model_cache: dict[str, str] | None = None  # {"host_path": DIR} or {"pvc": NAME}: pre-staged models
    storage_secret: str | None = None  # envFrom: e.g. AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY
    engine_secret: str | None = None  # secretKeyRef per secret engine option: e.g. key api_key
    env: dict[str, str] = field(default_factory=dict)
    service_account: str | None = None  # serviceAccountName: IRSA / Workload Identity for storage
    image_pull_secrets: tuple[str, ...] = ()  # Secrets to pull `image` from a private registry
    port: int = 8000  # a container's fixed port (a worker alone picks a free one)
    # who may call the RPC port (the pool's NetworkPolicy, objects.network_policy): Airflow's pods
    rpc_from: dict[str, Any] = field(default_factory=lambda: copy.deepcopy(DEFAULT_RPC_FROM))
    rpc_from_namespace: str | None = None  # where those pods run; None: the pool's namespace
    drain_timeout_s: int = int(worker_default("drain_timeout_s"))  # whole seconds: the grace period's
    idle_ttl_s: float = float(POOL_IDLE_TTL_S)
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
        check_callables(self.allowed_callables)
        for what, quantity in (("cpu", self.cpu), ("memory", self.memory), ("shm_size", self.shm_size)):
            parse_quantity(quantity, what)
        check_rpc_from(self.rpc_from, self.rpc_from_namespace)
        check_env(self.env)
        check_model_cache(self.model_cache)
        check_engine_secret(self.engine, self.engine_options, self.engine_secret)
        if self.service_account:  # empty: unset, like storage_secret and model_pvc
            check_object_name(self.service_account, "service_account", "ServiceAccount")
        if not isinstance(self.image_pull_secrets, list | tuple):
            raise ConfigError(
                f"image_pull_secrets: expected a list of Secret names, got {self.image_pull_secrets!r}"
            )
        for secret in self.image_pull_secrets:
            check_object_name(secret, "image_pull_secrets", "Secret")
        labels = self.node_selector
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in [*labels, *labels.values()]):
            raise ConfigError(f"node_selector: expected an object of label names to strings, got {labels!r}")
        if not all(isinstance(t, dict) for t in self.tolerations):
            raise ConfigError(
                f"tolerations: expected objects (key, operator, value, effect), got "
                f"{list(self.tolerations)!r}"
            )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KubernetesPoolSpec:
        check_known_fields(cls, data, "Kubernetes pool settings")
        data = dict(data)
        for key in (
            "allowed_prefixes",
            "allowed_callables",
            "allowed_adapters",
            "tolerations",
            "image_pull_secrets",
        ):
            if key in data:
                if data[key] and not isinstance(data[key], list | tuple):
                    raise ConfigError(f"{key}: expected a list, got {data[key]!r}")
                data[key] = tuple(data[key] or ())
        return cls(**data)

    def key(self) -> str:
        """What the workers run: changes replace the pods. Scale and lifecycle settings are not in it."""
        data = dataclasses.asdict(self)
        # rpc_from*: the NetworkPolicy's, not the pods': changing who may call replaces no worker
        for k in ("replicas", "idle_ttl_s", "scaledown_ttl_s", "rpc_from", "rpc_from_namespace"):
            data.pop(k)
        for k in (
            "allowed_callables",
            "allowed_adapters",
            "service_account",
            "image_pull_secrets",
            "engine_secret",
            "model_cache",
        ):
            if not data[k]:  # the default: pools from before the field keep their key
                data.pop(k)
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]

    @property
    def token_secret(self) -> str:
        return f"{self.name}-token"


# A Kubernetes resource quantity (apimachinery's resource.Quantity), without a sign: a decimal number
# and one suffix, binary (Ki…Ei), decimal (n u m k M G T P E) or an exponent (e3, E-2). ASCII digits
# only: ``\d`` would take other scripts' digits (Decimal reads "٤" as 4), which Kubernetes refuses.
_QUANTITY = re.compile(r"\+?([0-9]+\.?[0-9]*|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?")
_SUFFIX = {
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}


def parse_quantity(value: Any, what: str) -> Decimal:
    """A Kubernetes quantity (``4``, ``500m``, ``32Gi``, ``1e3``) as a number of units (cores, bytes);
    ``what`` names the setting in the error."""
    text = str(value).strip() if isinstance(value, str | int | float) and not isinstance(value, bool) else ""
    found = _QUANTITY.fullmatch(text)
    if found is None:
        raise ConfigError(
            f"{what}: {value!r} is not a Kubernetes quantity (a number with an optional suffix: 4, 500m, "
            "32Gi, 8G)"
        )
    number, suffix = Decimal(found.group(1)), found.group(2) or ""
    if suffix not in _SUFFIX:  # an exponent: e3, E-2
        return number.scaleb(int(suffix[1:]))
    return number * _SUFFIX[suffix]


def check_rpc_from(selector: Any, namespace: Any) -> None:
    """``rpc_from`` is a non-empty LabelSelector (an empty one admits every pod of the namespace) and
    ``rpc_from_namespace`` a namespace name or unset."""
    remedy = (
        "rpc_from: expected a label selector of the Airflow pods that call the workers, e.g. "
        '{"matchLabels": {"tier": "airflow"}}'
    )
    if not isinstance(selector, dict) or not set(selector) <= {"matchLabels", "matchExpressions"}:
        raise ConfigError(f"{remedy}; got {selector!r}")
    labels, expressions = selector.get("matchLabels") or {}, selector.get("matchExpressions") or []
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in [*labels, *labels.values()]):
        raise ConfigError(f"{remedy}; matchLabels must map label names to strings, got {labels!r}")
    if not isinstance(expressions, list) or not all(
        isinstance(e, dict) and isinstance(e.get("key"), str) and e.get("operator") in _SELECTOR_OPS
        for e in expressions
    ):
        raise ConfigError(
            f"{remedy}; matchExpressions must be objects with key, operator "
            f"({', '.join(_SELECTOR_OPS)}) and values, got {expressions!r}"
        )
    if not labels and not expressions:
        raise ConfigError(f"{remedy}; an empty selector would admit every pod of the namespace")
    if namespace is not None and (not isinstance(namespace, str) or not _DNS_LABEL.match(namespace)):
        raise ConfigError(f"rpc_from_namespace: {namespace!r} is not a namespace name (a DNS label)")


_SELECTOR_OPS = ("In", "NotIn", "Exists", "DoesNotExist")


@dataclass(frozen=True)
class RpcPeers:
    """Who may call a Kubernetes pool's workers (the peer of the pool's NetworkPolicy), as one source
    of the deployment names them: ``rpc_from``, a label selector (canonical JSON, so a reference stays
    hashable), and ``rpc_from_namespace``. ``None`` leaves a setting to the next source: the pool
    connection's extra, then ``[batchinfer]``, then the pool's default. Never a trigger param."""

    rpc_from: str | None = None
    rpc_from_namespace: str | None = None

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str) -> RpcPeers:
        """The two settings of ``data`` (a connection's extra, the config section), checked as the
        pool's spec checks them; ``source`` names where they were read in the error."""
        selector, namespace = (_unset_blank(data.get(k)) for k in ("rpc_from", "rpc_from_namespace"))
        if isinstance(selector, str):  # a config value, or a connection field, is JSON text
            try:
                selector = json.loads(selector)
            except ValueError as exc:
                example = '{"matchLabels": {"release": "airflow"}}'
                raise ConfigError(
                    f"{source}: rpc_from is not JSON ({exc}). Remedy: write a label selector, e.g. {example}"
                ) from exc
        try:
            check_rpc_from(DEFAULT_RPC_FROM if selector is None else selector, namespace)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from exc
        text = None if selector is None else json.dumps(selector, sort_keys=True)
        return cls(text, namespace)

    def over(self, fallback: RpcPeers) -> RpcPeers:
        """These settings, and ``fallback``'s where these leave one unset."""
        return RpcPeers(
            fallback.rpc_from if self.rpc_from is None else self.rpc_from,
            fallback.rpc_from_namespace if self.rpc_from_namespace is None else self.rpc_from_namespace,
        )

    def spec_fields(self) -> dict[str, Any]:
        """The settings that are set, as :class:`KubernetesPoolSpec` fields (its defaults fill the
        rest)."""
        out: dict[str, Any] = {} if self.rpc_from is None else {"rpc_from": json.loads(self.rpc_from)}
        if self.rpc_from_namespace is not None:
            out["rpc_from_namespace"] = self.rpc_from_namespace
        return out


def _unset_blank(value: Any) -> Any:
    """An empty config value or connection field is unset."""
    return None if value is None or (isinstance(value, str) and not value.strip()) else value


def check_engine_secret(engine: str, options: dict[str, Any], secret: Any) -> None:
    """Secret engine options come only from ``engine_secret`` (the Deployment's args and env values are
    readable with the ``view`` role), and that Secret only for an engine that takes some."""
    check_no_secrets(options, "engine_options")
    if not secret:  # empty: unset, like storage_secret
        return
    check_object_name(secret, "engine_secret", "Secret")
    if not secret_options(engine):
        raise ConfigError(
            f"engine_secret {secret!r}: the {engine} engine takes no secret options (the openai engine "
            "does: api_key, default_headers). Remedy: leave engine_secret out"
        )


def check_model_cache(cache: Any) -> None:
    """``model_cache`` is unset, ``{"host_path": "/absolute/dir"}`` or ``{"pvc": "CLAIM"}``."""
    if cache is None:
        return
    remedy = (
        'expected {"host_path": "/var/cache/batchinfer-models"} (a directory on each node) or '
        '{"pvc": "CLAIM"} (a PersistentVolumeClaim holding the pre-staged models)'
    )
    if not isinstance(cache, dict) or len(cache) != 1 or not set(cache) <= {"host_path", "pvc"}:
        raise ConfigError(f"model_cache: {remedy}; got {cache!r}")
    if "pvc" in cache:
        check_object_name(cache["pvc"], "model_cache.pvc", "PersistentVolumeClaim")
        return
    path = cache["host_path"]
    if not isinstance(path, str) or not path.startswith("/") or ".." in path.split("/") or path == "/":
        raise ConfigError(
            f"model_cache.host_path: {path!r} is not an absolute directory below / (without '..'); {remedy}"
        )


def check_env(env: Any) -> None:
    """Refuse user env that is not ``{NAME: "value"}`` with a C-identifier name the pod spec does not set."""
    if not isinstance(env, dict):
        raise ConfigError(f"env: expected a mapping of variable names to strings, got {type(env).__name__}")
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            raise ConfigError(
                f"env: {name!r} is not a valid environment variable name (letters, digits and '_', "
                "not starting with a digit)"
            )
        if name.upper().startswith(ENV_PREFIX):
            raise ConfigError(
                f"env: {name} is reserved: {ENV_PREFIX}* variables are the worker's own settings "
                "(its RPC token, the storage-prefix and callable allow-lists); set them with the pool's "
                "fields (allowed_prefixes, allowed_callables, ...), not env"
            )
        if name.upper() in RESERVED_ENV:
            raise ConfigError(f"env: {name} is set by the worker's pod spec: {RESERVED_ENV[name.upper()]}")
        secret = next((o for o in secret_options().values() if o.env == name), None)
        if secret is not None:  # a plain env value is as readable as an argument
            raise ConfigError(
                f"env: {name} holds the engine's {secret.name}, a secret: put it in the "
                f"Secret that engine_secret names (key {secret.name}), not in env"
            )
        if not isinstance(value, str):
            raise ConfigError(f"env: {name}: the value must be a string, got {value!r}")


def check_object_name(name: Any, what: str, kind: str) -> None:
    """``name`` must be a Kubernetes object name (a DNS subdomain: lowercase letters, digits, '-' and
    '.'), so a bad one is refused when the spec is built, not by the API server at scale-up."""
    if not isinstance(name, str) or len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        raise ConfigError(
            f"{what}: {name!r} is not a {kind} name (at most 253 lowercase letters, digits, '-' and '.')"
        )


def check_callables(entries: Any) -> None:
    """Each allowed callable is one non-empty entry without commas or whitespace: the workers get the
    list as one comma-separated variable, so an entry with a comma would allow two."""
    if isinstance(entries, str):
        raise ConfigError(f"allowed_callables: expected a list of 'package.module:function', got {entries!r}")
    for entry in entries:
        if not isinstance(entry, str) or not entry or any(c == "," or c.isspace() for c in entry):
            raise ConfigError(
                f"allowed_callables: {entry!r}: expected 'package.module:function', without commas or spaces"
            )
