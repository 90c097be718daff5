"""The refusals about what a run asks of its pool: the work's size (``replicas``, ``concurrency``,
shard and batch sizes, ``max_tokens``…) over the deployment's caps, and the ``kubernetes`` settings
of its worker pods (resources, images, Secrets, claims, accounts, env, placement) beyond what the
limits allow. :func:`~airflow_batchinfer.spec.limits.refusals` gathers them; the pool facts they read
are imported where they are used (see :mod:`~airflow_batchinfer.spec.limits`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.spec.limit_settings import SETTINGS_BY_NAME, cap_amount, matches, unset_cap, where_set

if TYPE_CHECKING:
    from airflow_batchinfer.spec.limits import TriggerLimits


def replica_refusals(params: Mapping[str, Any], limits: TriggerLimits) -> list[str]:
    replicas = params.get("replicas")
    if limits.max_replicas is not None and replicas is not None and float(replicas) > limits.max_replicas:
        return [f"replicas {replicas} is more than max_replicas {limits.max_replicas}"]
    return []


def gpu_refusals(kube: Mapping[str, Any], limits: TriggerLimits) -> list[str]:
    gpus = kube.get("gpus")
    if limits.max_gpus is None or gpus is None:
        return []
    try:
        over = float(gpus) > limits.max_gpus
    except (TypeError, ValueError):
        over = True
    return [f"kubernetes.gpus {gpus!r} is more than max_gpus {limits.max_gpus}"] if over else []


# The params that size the work a run puts on its pool, and their caps (kind "count").
SIZE_CAPS: tuple[tuple[str, str], ...] = (
    ("concurrency", "max_concurrency"),
    ("records_per_shard", "max_records_per_shard"),
    ("chunk_size", "max_chunk_size"),
    ("max_attempts", "max_max_attempts"),
    ("target_batch_tokens", "max_target_batch_tokens"),
    ("preflight_records", "max_preflight_records"),
    ("idle_ttl_s", "max_idle_ttl_s"),
    ("max_line_bytes", "max_max_line_bytes"),
    ("max_id_bytes", "max_max_id_bytes"),
)
# The ``kubernetes`` settings that size a worker pod, and their caps (kind "quantity").
RESOURCE_CAPS: tuple[tuple[str, str], ...] = (
    ("cpu", "max_cpu"),
    ("memory", "max_memory"),
    ("shm_size", "max_shm_size"),
)
# The ``kubernetes`` settings that name a Secret, a claim or an account, and the list allowing each.
NAME_ALLOWS: tuple[tuple[str, str], ...] = (
    ("storage_secret", "allowed_storage_secrets"),
    ("model_pvc", "allowed_model_pvcs"),
    ("service_account", "allowed_service_accounts"),
    ("engine_secret", "allowed_engine_secrets"),
)


def _adapter_count(params: Mapping[str, Any]) -> int | None:
    """How many LoRA adapters ``adapters`` names (``None``: none given, or not an object)."""
    adapters = params.get("adapters")
    return len(adapters) if isinstance(adapters, Mapping) else None


def _judge_count(params: Mapping[str, Any]) -> int | None:
    """How many judges judge each answer: the leaves of ``judge`` (``all``, ``any`` and ``jury`` nest
    judges; each ``llm`` one is a completion per answer, per candidate)."""
    from airflow_batchinfer.judges import judge_specs
    from airflow_batchinfer.judges.registry import NESTING

    judge = params.get("judge")
    if not isinstance(judge, Mapping):
        return None
    return sum(1 for j in judge_specs(judge) if j.get("type") not in NESTING)


# The caps on what multiplies the work of every record, and how many a run's params ask for: each
# holds unset at its own default (``LimitSetting.default``), raised by a DAG default above it.
WORK_COUNTS: dict[str, Callable[[Mapping[str, Any]], int | None]] = {
    "max_adapters": _adapter_count,
    "max_jury_members": _judge_count,
}
_WORK_WHAT = {
    "max_adapters": "adapters (LoRA adapters named)",
    "max_jury_members": "judge (judges per answer)",
}


def arms(params: Mapping[str, Any]) -> int:
    """The rows each input record becomes in round 0: one per arm with ``fan_out`` (its adapters, and
    the base model with ``adapters_and_base``), else one."""
    mode, adapters = params.get("fan_out"), _adapter_count(params)
    if mode in (None, "off") or not adapters:
        return 1
    return adapters + (1 if mode == "adapters_and_base" else 0)


def _cap_refusal(
    what: str, value: Any, cap_name: str, limits: TriggerLimits, *, quantity: bool = False
) -> list[str]:
    """``[why]`` when ``value`` is over its cap (a value that is no number is over it), else ``[]``."""
    from airflow_batchinfer.pools.kubernetes.spec import parse_quantity

    cap, unset = getattr(limits, cap_name), ""
    if cap is None and (cap := unset_cap(cap_name)) is not None:
        of = SETTINGS_BY_NAME[cap_name].unset_default_of
        unset = f" (unset: the {of} setting's default)" if of else " (unset: its default)"
    if cap is None:
        return []
    try:
        amount = parse_quantity(value, what) if quantity else Decimal(str(float(value)))
        over = amount > cap_amount(cap)
    except (ConfigError, TypeError, ValueError, InvalidOperation):
        over = True
    if not over:
        return []
    return [
        f"{what} {value!r} is more than {cap_name} {cap}{unset} (lower it, or widen with "
        f"{where_set(cap_name)})"
    ]


def size_refusals(params: Mapping[str, Any], limits: TriggerLimits) -> list[str]:
    """The params that size the work over their caps (only those present; ``None`` is no number)."""
    from airflow_batchinfer.engines.sampling import completion_tokens  # as SamplingParams reads it

    out: list[str] = []
    for name, cap in SIZE_CAPS:
        if name == "records_per_shard" and params.get(name) is not None and (n := arms(params)) > 1:
            # a shard holds records_per_shard records, each a row per arm: the rows are the work
            what = f"records_per_shard {params[name]!r} × {n} fan_out arms, in rows,"
            try:
                rows: Any = int(params[name]) * n
            except (TypeError, ValueError):
                rows = params[name]  # no number: over the cap, as written
            out += _cap_refusal(what, rows, cap, limits)
        elif name in params and (params[name] is not None or name == "idle_ttl_s"):  # None: never idles out
            out += _cap_refusal(name, params[name], cap, limits)
    for cap, count in WORK_COUNTS.items():
        if (asked := count(params)) is not None:
            out += _cap_refusal(_WORK_WHAT[cap], asked, cap, limits)
    sampling = params.get("sampling")
    if "sampling" in params and isinstance(sampling or {}, Mapping):
        from airflow_batchinfer.engines.base import SamplingParams

        tokens = completion_tokens(sampling or {})
        tokens = SamplingParams().max_tokens if tokens is None else tokens
        out += _cap_refusal("sampling.max_tokens", tokens, "max_max_tokens", limits)
    retries = params.get("retry_sampling")
    for attempt, fields in retries.items() if isinstance(retries, Mapping) else ():
        tokens = completion_tokens(fields) if isinstance(fields, Mapping) else None
        if tokens is not None:  # unset: the run's sampling's, checked above
            out += _cap_refusal(f"retry_sampling.{attempt}.max_tokens", tokens, "max_max_tokens", limits)
    for tokens in _judge_completion_tokens(params.get("judge")):
        out += _cap_refusal("judge max_tokens", tokens, "max_max_tokens", limits)
    return out + _resource_refusals(params, limits)


def _judge_completion_tokens(judge: Any) -> list[Any]:
    """The ``max_tokens`` each ``llm`` judge of a judge spec sets (``all``, ``any`` and ``jury`` nest
    judges)."""
    from airflow_batchinfer.engines.sampling import completion_tokens
    from airflow_batchinfer.judges import judge_specs

    found = []
    for j in judge_specs(judge):
        sampling = j.get("sampling")
        values = {**(sampling if isinstance(sampling, Mapping) else {}), **j}  # the top level wins
        tokens = completion_tokens(values)
        if j.get("type") == "llm" and tokens is not None:
            found.append(tokens)
    return found


def _resource_refusals(params: Mapping[str, Any], limits: TriggerLimits) -> list[str]:
    """A worker pod's cpu, memory and shm_size over their caps. A Kubernetes run that leaves one out
    gets the pool's default, which is checked then (``shm_size`` only for GPU workers, that mount it)."""
    from airflow_batchinfer.pools.kubernetes.spec import KubernetesPoolSpec

    kube = params.get("kubernetes") or {}
    if not isinstance(kube, Mapping):
        return []  # refused as malformed by kubernetes_refusals
    defaults = {f.name: f.default for f in dataclasses.fields(KubernetesPoolSpec)}
    on_kubernetes = bool(kube) or str(params.get("worker_pool") or "").startswith("kubernetes://")
    gpus = kube.get("gpus", defaults["gpus"])
    out: list[str] = []
    for key, cap in RESOURCE_CAPS:
        if key in kube:
            out += _cap_refusal(f"kubernetes.{key}", kube[key], cap, limits, quantity=True)
        elif on_kubernetes and (key != "shm_size" or gpus):
            out += _cap_refusal(
                f"kubernetes.{key} (unset: the pool's default)", defaults[key], cap, limits, quantity=True
            )
    return out


def kubernetes_refusals(kube: Mapping[str, Any], limits: TriggerLimits) -> list[str]:
    from airflow_batchinfer.pools.kubernetes.spec import TRIGGER_KEYS

    if not isinstance(kube, Mapping):
        return [f"kubernetes must be an object, got {kube!r}"]
    out = [
        f"kubernetes.{key} is not a trigger setting: the DAG or the pool connection sets it "
        f"(a trigger may set {', '.join(sorted(TRIGGER_KEYS))})"
        for key in sorted(set(kube) - TRIGGER_KEYS)
    ]
    if (image := kube.get("image")) and not any(matches(e, str(image)) for e in limits.allowed_images):
        out.append(f"kubernetes.image {image!r} is not allowed (widen with {where_set('allowed_images')})")
    for key, setting in NAME_ALLOWS:
        if (name := kube.get(key)) and str(name) not in getattr(limits, setting):
            out.append(f"kubernetes.{key} {name!r} is not allowed (widen with {where_set(setting)})")
    for name in pull_secrets(kube, "kubernetes", out):
        if name not in limits.allowed_image_pull_secrets:
            out.append(
                f"kubernetes.image_pull_secrets {name!r} is not allowed (widen with "
                f"{where_set('allowed_image_pull_secrets')})"
            )
    env, labels, tolerations = placement(kube, "kubernetes", out)
    for name in sorted(set(env) - set(limits.allowed_env)):
        out.append(f"kubernetes.env.{name} is not allowed (widen with {where_set('allowed_env')})")
    for key, value in sorted(labels.items()):
        if not {f"{key}={value}", str(key)} & set(limits.allowed_node_selectors):
            out.append(
                f"kubernetes.node_selector {key}={value} is not allowed (widen with "
                f"{where_set('allowed_node_selectors')})"
            )
    tolerable = set(limits.allowed_toleration_keys)
    for key in sorted({toleration_key(t) for t in tolerations} - tolerable):
        what = "every taint (a toleration without a key)" if key == "*" else f"the taint key {key!r}"
        out.append(
            f"kubernetes.tolerations may not tolerate {what} (widen with "
            f"{where_set('allowed_toleration_keys')})"
        )
    if kube.get("interruptible") and (spot := sorted(spot_keys() - tolerable)):
        out.append(
            f"kubernetes.interruptible tolerates the spot taints {spot}, which are not allowed (widen "
            f"with {where_set('allowed_toleration_keys')})"
        )
    return out + gpu_refusals(kube, limits)


def toleration_key(toleration: Mapping[str, Any]) -> str:
    """The taint key a toleration tolerates (``*``: every taint)."""
    return str(toleration.get("key") or "*")


def spot_keys() -> set[str]:
    from airflow_batchinfer.pools.kubernetes.spec import SPOT_TOLERATIONS

    return {toleration_key(t) for t in SPOT_TOLERATIONS}


def placement(
    kube: Mapping[str, Any], where: str, problems: list[str] | None = None
) -> tuple[Mapping[str, Any], Mapping[str, Any], list[Mapping[str, Any]]]:
    """``env``, ``node_selector`` and ``tolerations`` of a ``kubernetes`` setting (empty when absent
    or malformed). What is malformed is added to ``problems``, or raised when that is ``None``."""
    env, labels = kube.get("env") or {}, kube.get("node_selector") or {}
    tolerations = kube.get("tolerations") or []
    found: list[str] = []
    if not isinstance(env, Mapping):
        found.append(f"{where}.env must be an object of names to strings, got {env!r}")
        env = {}
    if not isinstance(labels, Mapping):
        found.append(f"{where}.node_selector must be an object of labels to values, got {labels!r}")
        labels = {}
    if not isinstance(tolerations, list | tuple) or not all(isinstance(t, Mapping) for t in tolerations):
        found.append(
            f"{where}.tolerations must be a list of objects (key, operator, value, effect), "
            f"got {tolerations!r}"
        )
        tolerations = []
    if problems is None and found:
        raise ConfigError("; ".join(found))
    if problems is not None:
        problems += found
    return env, labels, list(tolerations)


def pull_secrets(kube: Mapping[str, Any], where: str, problems: list[str] | None = None) -> tuple[str, ...]:
    """``image_pull_secrets`` of a ``kubernetes`` setting (empty when absent or malformed); what is
    malformed is added to ``problems``, or raised when that is ``None`` (as :func:`placement`)."""
    names = kube.get("image_pull_secrets") or []
    if isinstance(names, list | tuple) and all(isinstance(n, str) for n in names):
        return tuple(names)
    found = f"{where}.image_pull_secrets must be a list of Secret names, got {names!r}"
    if problems is None:
        raise ConfigError(found)
    problems.append(found)
    return ()
