"""What the people who trigger a DAG may choose: limits the deployment pins (docs/security.md).

A DAG's params are user input: whoever may trigger the DAG fills them in. The people who deploy it
are trusted more, and pin what a trigger may choose, in three places that widen one another:

- the DAG's own defaults (what its author wrote is allowed as written) and its ``limits=`` argument
  (:func:`~airflow_batchinfer.dag_factory.build_batch_inference_dag`);
- the provider's config section ``[batchinfer]`` (``AIRFLOW__BATCHINFER__ALLOWED_INPUT_PREFIXES``…);
- the ``batchinfer_pool`` connection the run's ``worker_pool`` names (its extra; admins own it).

Trigger params cannot widen anything. :func:`refusals` is the one decision, a pure function of the
params and the limits (:func:`cap_refusals`, its caps alone, for a DAG built without ``limits=``); the
first tasks of a run (shard, pool setup) and the teardown call it before
they touch storage or a pool (``operators/limits.py`` gathers the inputs). Nothing here imports
Airflow. The pool facts the checks read (quantities, a Kubernetes spec's keys, pool references) are
imported where they are used: ``get_provider_info`` imports this module in every Airflow process,
which must not load the pools (the pools import nothing of this module).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from airflow_batchinfer.exceptions import ConfigError

# count: a whole number; quantity: a Kubernetes quantity (``8``, ``500m``, ``32Gi``); both caps, unset
# (``None``) is no cap
Kind = Literal["prefixes", "names", "count", "quantity"]
CAP_KINDS = ("count", "quantity")


@dataclass(frozen=True)
class LimitSetting:
    """One limit: its name (the config key, the connection extra key and the field), kind and help.
    ``unset_default_of``: a cap that holds even where no one sets it, at the default of the run
    setting it names (a trigger may lower that setting, not raise it); ``None``: unset is no cap."""

    name: str
    kind: Kind
    help: str
    unset_default_of: str | None = None


# The one description of every limit: the dataclass below, the provider's config section, the
# connection form and the docs derive from it.
SETTINGS: tuple[LimitSetting, ...] = (
    LimitSetting("allowed_input_prefixes", "prefixes",
                 "storage locations the `input` param may name (the pool's workers may read them: round 0 "
                 "reads the input in place)"),
    LimitSetting("allowed_output_prefixes", "prefixes",
                 "storage locations `output_root` may name (the run root is written there, by the "
                 "pool's workers too)"),
    LimitSetting("allowed_worker_pools", "names",
                 "pool references `worker_pool` may name besides the DAG's default and any "
                 "`batchinfer_pool` connection (`local://` allows every local pool, "
                 "`kubernetes://NAMESPACE/` every pool of a namespace)"),
    LimitSetting("allowed_engines", "names",
                 "engines `engine` may name besides the DAG's default (the `openai` engine sends prompts "
                 "where its `base_url` points)"),
    LimitSetting("allowed_models", "names",
                 "models `model` may name besides the DAG's default (a path on the workers, or "
                 "`builtin:smollm2`; an entry ending in `/` allows a directory)"),
    LimitSetting("allowed_adapters", "names",
                 "LoRA adapter directories `adapters` may name besides the DAG default's (paths on the "
                 "workers, compared as their real paths; an entry ending in `/` allows a directory)"),
    LimitSetting("allowed_engine_options", "names",
                 "`engine_options` keys a trigger may set besides those the DAG's default sets (keys "
                 "such as `trust_remote_code` or `base_url` only when listed)"),
    LimitSetting("allowed_images", "names",
                 "worker images `kubernetes.image` may name (an entry ending in `:` or `/` allows "
                 "every tag or every image under it)"),
    LimitSetting("allowed_storage_secrets", "names", "Secrets `kubernetes.storage_secret` may mount"),
    LimitSetting("allowed_engine_secrets", "names",
                 "Secrets `kubernetes.engine_secret` may give the engine its secret options from "
                 "(`api_key`, `default_headers` of the `openai` engine, one key each)"),
    LimitSetting("allowed_model_pvcs", "names", "volume claims `kubernetes.model_pvc` may mount"),
    LimitSetting("allowed_service_accounts", "names",
                 "ServiceAccounts `kubernetes.service_account` may run the worker pods as (the cloud "
                 "identity their storage access comes from, by IRSA or Workload Identity)"),
    LimitSetting("allowed_image_pull_secrets", "names",
                 "Secrets `kubernetes.image_pull_secrets` may name to pull the worker image with"),
    LimitSetting("allowed_node_selectors", "names",
                 "`kubernetes.node_selector` labels a trigger may set besides the DAG default's: "
                 "`key=value`, or `key` for any value of that label"),
    LimitSetting("allowed_toleration_keys", "names",
                 "taint keys `kubernetes.tolerations` may tolerate besides the DAG default's (`*`: "
                 "a toleration without a key, which tolerates every taint)"),
    LimitSetting("allowed_env", "names",
                 "variable names `kubernetes.env` may set besides those the DAG's default sets (a "
                 "variable overrides the same key of the `storage_secret`, and can change what the "
                 "image runs: `AWS_ENDPOINT_URL`, `LD_PRELOAD` only when listed)"),
    LimitSetting("allowed_judge_callables", "names",
                 "`module:function` targets a `callable` judge may name (an entry ending in `.` or "
                 "`:` allows a package or a module); the pool's workers allow the same"),
    LimitSetting("shared_run_root_dags", "names",
                 "DAG ids whose runs may take over each other's finished run roots (a run root belongs "
                 "to the DAG that created it: a run of another DAG is refused, so one who may trigger "
                 "only DAG `a` cannot name DAG `b`'s `output_root` and `run_name` to read and rewrite "
                 "its results; list DAGs here only if their triggerers and readers are the same people)"),
    LimitSetting("max_replicas", "count", "the most workers `replicas` may ask for"),
    LimitSetting("max_gpus", "count", "the most GPUs per worker `kubernetes.gpus` may ask for"),
    # the size of the work a run puts on a (shared) pool: caps, checked like max_replicas
    LimitSetting("max_concurrency", "count",
                 "the most shard jobs per worker `concurrency` and `judge_concurrency` may ask for"),
    LimitSetting("max_records_per_shard", "count",
                 "the most records per shard `records_per_shard` may ask for"),
    LimitSetting("max_chunk_size", "count", "the most records a job holds per step `chunk_size` may ask for"),
    LimitSetting("max_max_attempts", "count", "the most attempts per sample `max_attempts` may ask for"),
    LimitSetting("max_target_batch_tokens", "count",
                 "the most tokens per engine batch `target_batch_tokens` may ask for"),
    LimitSetting("max_max_tokens", "count",
                 "the most tokens per completion `sampling.max_tokens` (unset: 256), a `retry_sampling` "
                 "entry's and an `llm` judge's `max_tokens` may ask for"),
    LimitSetting("max_preflight_records", "count", "the most records `preflight_records` may try"),
    # input bounds: a larger one lets a line (an id) be held whole, so unset caps them at the default
    LimitSetting("max_max_line_bytes", "count",
                 "the longest input line, in bytes, `max_line_bytes` may allow (unset: that setting's "
                 "default, so a trigger may lower the bound but not raise it)",
                 unset_default_of="max_line_bytes"),
    LimitSetting("max_max_id_bytes", "count",
                 "the longest record id, in UTF-8 bytes, `max_id_bytes` may allow (unset: that setting's "
                 "default, so a trigger may lower the bound but not raise it)",
                 unset_default_of="max_id_bytes"),
    LimitSetting("max_idle_ttl_s", "count",
                 "the longest idle time, in seconds, `idle_ttl_s` may keep a pool's workers up"),
    LimitSetting("max_cpu", "quantity",
                 "the most CPU per worker `kubernetes.cpu` may request (a Kubernetes quantity: `8`, "
                 "`500m`; unset in the param: the pool's 4)"),
    LimitSetting("max_memory", "quantity",
                 "the most memory per worker `kubernetes.memory` may request (a Kubernetes quantity: "
                 "`64Gi`; unset in the param: the pool's 32Gi)"),
    LimitSetting("max_shm_size", "quantity",
                 "the most shared memory per GPU worker `kubernetes.shm_size` may ask for (a Kubernetes "
                 "quantity: `16Gi`; unset in the param: the pool's 8Gi)"),
)  # fmt: skip
_SETTING: dict[str, LimitSetting] = {s.name: s for s in SETTINGS}
CONFIG_SECTION = "batchinfer"


@dataclass(frozen=True)
class PoolNetworkSetting:
    """Who may call a Kubernetes pool's workers: a ``[batchinfer]`` key and the ``batchinfer_pool``
    connection's extra key of the same name (it wins), never a trigger param
    (:class:`~airflow_batchinfer.pools.kubernetes.spec.RpcPeers` reads them)."""

    name: str
    example: str
    help: str


# The one description of each: the provider's config section, the connection form and the docs
# derive from it.
POOL_NETWORK_SETTINGS: tuple[PoolNetworkSetting, ...] = (
    PoolNetworkSetting("rpc_from", '{"matchLabels": {"release": "airflow"}}',
                       "the Airflow pods that may call a Kubernetes pool's workers, as a label selector "
                       "(JSON): the pool's NetworkPolicy admits only them to its RPC port (unset: the "
                       "Helm chart's `tier: airflow` pods whose `component` is `worker`, `triggerer`, "
                       "`scheduler` or `api-server`; an empty selector is refused)"),
    PoolNetworkSetting("rpc_from_namespace", "airflow",
                       "the namespace those pods run in (unset: the pool's own)"),
)  # fmt: skip
SAFE_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")


def matches(entry: str, value: str) -> bool:
    """An allow-list entry admits ``value`` when equal, or as a prefix when it ends in ``/ : .``."""
    return value == entry or (entry[-1:] in ("/", ":", ".") and value.startswith(entry))


def _names(value: Any, what: str) -> tuple[str, ...]:
    """A list, or comma-separated text (config files and connection forms hold text)."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, Iterable):
        raise ConfigError(f"{what}: expected a list or comma-separated text, got {value!r}")
    return tuple(str(v).strip() for v in items if str(v).strip())


def _count(value: Any, what: str) -> int | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what}: expected a whole number, got {value!r}") from None
    if number < 0:
        raise ConfigError(f"{what}: must be >= 0, got {number}")
    return number


def _quantity(value: Any, what: str) -> str | None:
    """A Kubernetes quantity cap, kept as written (``32Gi``) once it parses."""
    from airflow_batchinfer.pools.kubernetes.spec import parse_quantity

    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    parse_quantity(value, what)
    return str(value).strip()


def _amount(value: Any) -> Decimal:
    """A cap's value as a number: a count, or a quantity's units (cores, bytes)."""
    from airflow_batchinfer.pools.kubernetes.spec import parse_quantity

    return Decimal(value) if isinstance(value, int) else parse_quantity(value, "a cap")


def _larger(mine: Any, theirs: Any) -> Any:
    return theirs if _amount(theirs) > _amount(mine) else mine


@dataclass(frozen=True)
class TriggerLimits:
    """What trigger params may choose (see :data:`SETTINGS` for each field). Empty lists allow
    nothing beyond the DAG's defaults; an unset maximum (``None``) is no limit."""

    allowed_input_prefixes: tuple[str, ...] = ()
    allowed_output_prefixes: tuple[str, ...] = ()
    allowed_worker_pools: tuple[str, ...] = ()
    allowed_engines: tuple[str, ...] = ()
    allowed_models: tuple[str, ...] = ()
    allowed_adapters: tuple[str, ...] = ()
    allowed_engine_options: tuple[str, ...] = ()
    allowed_images: tuple[str, ...] = ()
    allowed_storage_secrets: tuple[str, ...] = ()
    allowed_engine_secrets: tuple[str, ...] = ()
    allowed_model_pvcs: tuple[str, ...] = ()
    allowed_service_accounts: tuple[str, ...] = ()
    allowed_image_pull_secrets: tuple[str, ...] = ()
    allowed_node_selectors: tuple[str, ...] = ()
    allowed_toleration_keys: tuple[str, ...] = ()
    allowed_env: tuple[str, ...] = ()
    allowed_judge_callables: tuple[str, ...] = ()
    shared_run_root_dags: tuple[str, ...] = ()
    max_replicas: int | None = None
    max_gpus: int | None = None
    max_concurrency: int | None = None
    max_records_per_shard: int | None = None
    max_chunk_size: int | None = None
    max_max_attempts: int | None = None
    max_target_batch_tokens: int | None = None
    max_max_tokens: int | None = None
    max_preflight_records: int | None = None
    max_max_line_bytes: int | None = None  # None: the cap is the setting's default (unset_default_of)
    max_max_id_bytes: int | None = None
    max_idle_ttl_s: int | None = None
    max_cpu: str | None = None  # Kubernetes quantities, as written
    max_memory: str | None = None
    max_shm_size: str | None = None

    def __post_init__(self) -> None:  # lists as tuples (hashable, and the same whatever was passed)
        for s in SETTINGS:
            if s.kind == "quantity":  # checked here too: a DAG's limits= is built directly
                object.__setattr__(self, s.name, _quantity(getattr(self, s.name), s.name))
            elif s.kind != "count":
                object.__setattr__(self, s.name, _names(getattr(self, s.name), s.name))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, source: str) -> TriggerLimits:
        """The limits among ``data``'s keys (other keys are ignored: a connection's extra holds more).
        ``source`` names where they come from, for errors."""
        data = data or {}
        values: dict[str, Any] = {}
        for s in SETTINGS:
            if s.name in data:
                what = f"{source}: {s.name}"
                parse = {"count": _count, "quantity": _quantity}.get(s.kind, _names)
                values[s.name] = parse(data[s.name], what)
        return cls(**values)

    def widen(self, other: TriggerLimits | None) -> TriggerLimits:
        """Both limits' allowances: lists joined, the larger maximum."""
        if other is None:
            return self
        values: dict[str, Any] = {}
        for s in SETTINGS:
            mine, theirs = getattr(self, s.name), getattr(other, s.name)
            if s.kind in CAP_KINDS:
                values[s.name] = theirs if mine is None else mine if theirs is None else _larger(mine, theirs)
            else:
                values[s.name] = tuple(dict.fromkeys((*mine, *theirs)))
        return TriggerLimits(**values)

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


def callable_targets(judge: Any) -> list[str]:
    """Every ``callable`` judge target in a judge spec (``all``, ``any`` and ``jury`` nest judges)."""
    from airflow_batchinfer.judges import judge_specs

    return [str(j.get("target")) for j in judge_specs(judge) if j.get("type") == "callable"]


def implied_by(defaults: Mapping[str, Any]) -> TriggerLimits:
    """What a DAG's defaults allow as written: its author chose them, in code."""
    from airflow_batchinfer.pools.kubernetes.spec import DEFAULT_IMAGE

    kube = defaults.get("kubernetes") or {}
    if not isinstance(kube, Mapping):
        raise ConfigError(f"the DAG's default kubernetes must be an object, got {kube!r}")
    env, labels, tolerations = _placement(kube, "the DAG's default kubernetes")
    spot = bool(kube.get("interruptible"))
    limits = TriggerLimits(
        allowed_input_prefixes=tuple(v for v in [defaults.get("input")] if v),
        allowed_output_prefixes=tuple(v for v in [defaults.get("output_root")] if v),
        allowed_worker_pools=tuple(v for v in [defaults.get("worker_pool")] if v),
        allowed_engines=tuple(v for v in [defaults.get("engine")] if v),
        allowed_models=tuple(v for v in [defaults.get("model")] if v),
        allowed_adapters=tuple(_adapter_paths(defaults.get("adapters"))),
        allowed_engine_options=tuple(defaults.get("engine_options") or {}),
        allowed_images=(kube.get("image") or DEFAULT_IMAGE,),
        allowed_storage_secrets=tuple(v for v in [kube.get("storage_secret")] if v),
        allowed_engine_secrets=tuple(v for v in [kube.get("engine_secret")] if v),
        allowed_model_pvcs=tuple(v for v in [kube.get("model_pvc")] if v),
        allowed_service_accounts=tuple(v for v in [kube.get("service_account")] if v),
        allowed_image_pull_secrets=_pull_secrets(kube, "the DAG's default kubernetes"),
        allowed_node_selectors=tuple(f"{k}={v}" for k, v in labels.items()),
        allowed_toleration_keys=tuple(
            dict.fromkeys([*(_toleration_key(t) for t in tolerations), *(_spot_keys() if spot else ())])
        ),
        allowed_env=tuple(env),
        allowed_judge_callables=tuple(callable_targets(defaults.get("judge"))),
        **_implied_caps(defaults),
    )
    judge = judge_pool_view(defaults)
    return limits.widen(implied_by(judge)) if judge else limits


def _implied_caps(defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The caps that hold unset (:func:`unset_cap`) raised to a DAG default above them, which its
    author wrote; a default at or below sets none, so the deployment may still lower the cap."""
    out: dict[str, Any] = {}
    for s in SETTINGS:
        if s.unset_default_of is None:
            continue
        value = _count(defaults.get(s.unset_default_of), f"the DAG's default {s.unset_default_of}")
        if value is not None and value > (unset_cap(s.name) or 0):
            out[s.name] = value
    return out


# A judge with its own pool (``judge_pool``) names that pool's settings with these params; they are
# checked against the same limits as the run's pool.
JUDGE_POOL_PARAMS = {
    "worker_pool": "judge_pool",
    "engine": "judge_engine",
    "model": "judge_model",
    "engine_options": "judge_engine_options",
    "replicas": "judge_replicas",
    "concurrency": "judge_concurrency",
    "kubernetes": "judge_kubernetes",
}


def _toleration_key(toleration: Mapping[str, Any]) -> str:
    """The taint key a toleration tolerates (``*``: every taint)."""
    return str(toleration.get("key") or "*")


def _spot_keys() -> set[str]:
    from airflow_batchinfer.pools.kubernetes.spec import SPOT_TOLERATIONS

    return {_toleration_key(t) for t in SPOT_TOLERATIONS}


def _placement(
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


def _pull_secrets(kube: Mapping[str, Any], where: str, problems: list[str] | None = None) -> tuple[str, ...]:
    """``image_pull_secrets`` of a ``kubernetes`` setting (empty when absent or malformed); what is
    malformed is added to ``problems``, or raised when that is ``None`` (as :func:`_placement`)."""
    names = kube.get("image_pull_secrets") or []
    if isinstance(names, list | tuple) and all(isinstance(n, str) for n in names):
        return tuple(names)
    found = f"{where}.image_pull_secrets must be a list of Secret names, got {names!r}"
    if problems is None:
        raise ConfigError(found)
    problems.append(found)
    return ()


def judge_pool_view(params: Mapping[str, Any]) -> dict[str, Any]:
    """The judge pool's settings under the run pool's names (empty without ``judge_pool``)."""
    if not params.get("judge_pool"):
        return {}
    return {key: params[name] for key, name in JUDGE_POOL_PARAMS.items() if name in params}


def judge_pool_refusal(judge_pool: object, worker_pool: object) -> str | None:
    """Why ``judge_pool`` cannot serve as the judge's own pool: it is the run's ``worker_pool``, however
    either is written (``None``: it can, or one of them is unset). The one rule behind the DAG
    params' checks and ``batchinfer run --judge-pool``. A reference that does not parse is compared
    as written (its own check says what is wrong with it)."""
    if not judge_pool or not worker_pool:
        return None
    if _pool_key(judge_pool) != _pool_key(worker_pool):
        return None
    return (
        f"judge_pool {str(judge_pool)!r} is the run's own worker_pool: leave judge_pool out to judge on "
        "the run's pool (one job per shard), or name another pool"
    )


def _pool_key(pool: object) -> str:
    from airflow_batchinfer.pools.ref import PoolRef

    try:
        return str(PoolRef.parse(str(pool)))
    except ConfigError:
        return str(pool)


def _where(setting: str) -> str:
    return (
        f"the DAG's limits, the [{CONFIG_SECTION}] {setting} setting, or the pool connection's extra "
        f"{setting}"
    )


def _within(uri: str, prefixes: tuple[str, ...]) -> bool:
    from airflow_batchinfer.worker.security import PrefixPolicy  # the workers' rules, exactly

    return bool(prefixes) and PrefixPolicy(list(prefixes)).allows(uri)


def refusals(
    params: Mapping[str, Any],
    limits: TriggerLimits,
    *,
    run_root: str | None = None,
    pool_is_connection: bool = False,
    judge_limits: TriggerLimits | None = None,
    judge_pool_is_connection: bool = False,
) -> list[str]:
    """Why a DAG run's ``params`` go beyond ``limits`` (empty: they do not). Only the params present
    are checked: ``input``, ``output_root``, ``run_name``, ``worker_pool``, ``engine``, ``model``,
    ``adapters``, ``engine_options``, ``judge``, ``replicas`` and ``kubernetes``. ``run_root``: the run
    root the task rendered (``output_root`` plus the run's name), checked too. ``pool_is_connection``:
    ``worker_pool`` names a connection of type ``batchinfer_pool`` (which pins its own pool and is
    always allowed). The judge's own pool (``judge_pool`` and the other :data:`JUDGE_POOL_PARAMS`)
    is checked like the run's, against ``judge_limits`` (default: ``limits``; the judge pool
    connection widens only those), and may not be the run's pool."""
    out: list[str] = []
    if judge := judge_pool_view(params):
        if same := judge_pool_refusal(judge["worker_pool"], params.get("worker_pool")):
            out.append(same)
        judged = refusals(judge, judge_limits or limits, pool_is_connection=judge_pool_is_connection)
        out += [f"judge pool: {w}" for w in judged]
    for what, uri, setting in (
        ("input", params.get("input"), "allowed_input_prefixes"),
        ("output_root", params.get("output_root"), "allowed_output_prefixes"),
        ("the run root", run_root, "allowed_output_prefixes"),
    ):
        prefixes = getattr(limits, setting)
        if uri and not _within(str(uri), prefixes):
            out.append(f"{what} {str(uri)!r} is outside {list(prefixes)} (widen with {_where(setting)})")
    if pool := params.get("worker_pool"):
        from airflow_batchinfer.pools.ref import PoolRef

        ref = PoolRef.parse(str(pool))
        # a reference that names its own Kubernetes connection must be allowed as written: a prefix
        # entry (every pool of a namespace) does not let a trigger choose the credentials
        exact = ref.kubernetes_conn_id is not None
        allowed = any(
            e == str(ref) or (not exact and matches(e, str(ref))) for e in limits.allowed_worker_pools
        )
        if not pool_is_connection and not allowed:
            why = f"widen with {_where('allowed_worker_pools')}"
            out.append(
                f"worker_pool {str(ref)!r} is not the DAG's pool, a batchinfer_pool connection "
                f"or allowed ({why})"
            )
    run_name = params.get("run_name")
    if run_name and (not SAFE_NAME.fullmatch(str(run_name)) or set(str(run_name)) == {"."}):
        out.append(f"run_name {run_name!r} must be one folder name (letters, digits, . _ - ; not . or ..)")
    engine = params.get("engine")
    if engine and not any(matches(e, str(engine)) for e in limits.allowed_engines):
        out.append(f"engine {engine!r} is not the DAG's nor allowed (widen with {_where('allowed_engines')})")
    if model := params.get("model"):
        out += _model_refusals(str(model), limits.allowed_models)
    for path in _adapter_paths(params.get("adapters")):
        out += _model_refusals(path, limits.allowed_adapters, "adapter", "allowed_adapters")
    options = params.get("engine_options") or {}
    out += _secret_option_refusals(options)
    for key in (
        sorted(set(options) - set(limits.allowed_engine_options)) if isinstance(options, Mapping) else []
    ):
        out.append(f"engine_options.{key} is not allowed (widen with {_where('allowed_engine_options')})")
    for target in callable_targets(params.get("judge")):
        if not any(matches(e, target) for e in limits.allowed_judge_callables):
            out.append(
                f"judge callable {target!r} is not allowed (widen with {_where('allowed_judge_callables')})"
            )
    out += _replica_refusals(params, limits)
    out += _kubernetes_refusals(params.get("kubernetes") or {}, limits)
    out += _size_refusals(params, limits)
    return out


def cap_refusals(
    params: Mapping[str, Any], limits: TriggerLimits, *, judge_limits: TriggerLimits | None = None
) -> list[str]:
    """The caps alone of :func:`refusals` (every ``max_*``, the judge pool's against
    ``judge_limits``): what holds for a DAG built without ``limits=``, whose code vouches for its
    paths, pools and engines but not for the size of the work its triggers ask of a shared pool."""
    out: list[str] = []
    if judge := judge_pool_view(params):
        out += [f"judge pool: {w}" for w in cap_refusals(judge, judge_limits or limits)]
    kube = params.get("kubernetes") or {}
    out += _replica_refusals(params, limits)
    out += _gpu_refusals(kube, limits) if isinstance(kube, Mapping) else []
    return out + _size_refusals(params, limits)


def _replica_refusals(params: Mapping[str, Any], limits: TriggerLimits) -> list[str]:
    replicas = params.get("replicas")
    if limits.max_replicas is not None and replicas is not None and float(replicas) > limits.max_replicas:
        return [f"replicas {replicas} is more than max_replicas {limits.max_replicas}"]
    return []


def _gpu_refusals(kube: Mapping[str, Any], limits: TriggerLimits) -> list[str]:
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


def _cap_refusal(
    what: str, value: Any, cap_name: str, limits: TriggerLimits, *, quantity: bool = False
) -> list[str]:
    """``[why]`` when ``value`` is over its cap (a value that is no number is over it), else ``[]``."""
    from airflow_batchinfer.pools.kubernetes.spec import parse_quantity

    cap, unset = getattr(limits, cap_name), ""
    if cap is None and (cap := unset_cap(cap_name)) is not None:
        unset = f" (unset: the {_SETTING[cap_name].unset_default_of} setting's default)"
    if cap is None:
        return []
    try:
        amount = parse_quantity(value, what) if quantity else Decimal(str(float(value)))
        over = amount > _amount(cap)
    except (ConfigError, TypeError, ValueError, InvalidOperation):
        over = True
    if not over:
        return []
    return [
        f"{what} {value!r} is more than {cap_name} {cap}{unset} (lower it, or widen with {_where(cap_name)})"
    ]


def unset_cap(cap_name: str) -> int | None:
    """The cap in force where no limit sets ``cap_name``: the default of the run setting its
    :attr:`LimitSetting.unset_default_of` names, or ``None`` (no cap)."""
    of = _SETTING[cap_name].unset_default_of
    if of is None:
        return None
    from airflow_batchinfer.spec.settings import setting  # the one default (settings imports more)

    return int(setting(of).default)


def _size_refusals(params: Mapping[str, Any], limits: TriggerLimits) -> list[str]:
    """The params that size the work over their caps (only those present; ``None`` is no number)."""
    from airflow_batchinfer.engines.sampling import completion_tokens  # as SamplingParams reads it

    out: list[str] = []
    for name, cap in SIZE_CAPS:
        if name in params and (params[name] is not None or name == "idle_ttl_s"):  # None: never idles out
            out += _cap_refusal(name, params[name], cap, limits)
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
        return []  # refused as malformed by _kubernetes_refusals
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


def _model_refusals(
    model: str, allowed: tuple[str, ...], what: str = "model", setting: str = "allowed_models"
) -> list[str]:
    """Why ``model`` (or an adapter's directory) is refused: a local path compares as its normalised
    real path, by whole segments (``/models/../etc`` is ``/etc``, not under ``/models/``); other
    references as written (:func:`~airflow_batchinfer.worker.security.model_allows`, the workers' rules)."""
    from airflow_batchinfer.worker.security import is_path_model, model_allows, normalize_model

    widen = f"widen with {_where(setting)}"
    try:
        if any(model_allows(e, model) for e in allowed):
            return []
        key = normalize_model(model)
    except ValueError as exc:  # no allow-list entry can bound it: the message says what to pass
        return [f"{what} {exc}"]
    resolved = f" (it resolves to {key})" if is_path_model(model) and key != model.rstrip("/") else ""
    return [f"{what} {model!r}{resolved} is not the DAG's nor allowed ({widen})"]


def _adapter_paths(adapters: Any) -> list[str]:
    """The directories of an ``adapters`` param (a bad one is refused by the run's settings check)."""
    if not isinstance(adapters, Mapping):
        return []
    return [str(p) for p in adapters.values() if isinstance(p, str) and p]


def _secret_option_refusals(options: Any) -> list[str]:
    """A secret engine option (``api_key``…) as a param is refused whatever the limits allow: params
    are stored with the run and shown in the UI, and would reach the workers' arguments."""
    from airflow_batchinfer.engines import secret_options, secret_refusal

    if not isinstance(options, Mapping):
        return []
    return [secret_refusal(key, "engine_options") for key in sorted(set(options) & set(secret_options()))]


def _kubernetes_refusals(kube: Mapping[str, Any], limits: TriggerLimits) -> list[str]:
    from airflow_batchinfer.pools.kubernetes.spec import TRIGGER_KEYS

    if not isinstance(kube, Mapping):
        return [f"kubernetes must be an object, got {kube!r}"]
    out = [
        f"kubernetes.{key} is not a trigger setting: the DAG or the pool connection sets it "
        f"(a trigger may set {', '.join(sorted(TRIGGER_KEYS))})"
        for key in sorted(set(kube) - TRIGGER_KEYS)
    ]
    if (image := kube.get("image")) and not any(matches(e, str(image)) for e in limits.allowed_images):
        out.append(f"kubernetes.image {image!r} is not allowed (widen with {_where('allowed_images')})")
    for key, setting in NAME_ALLOWS:
        if (name := kube.get(key)) and str(name) not in getattr(limits, setting):
            out.append(f"kubernetes.{key} {name!r} is not allowed (widen with {_where(setting)})")
    for name in _pull_secrets(kube, "kubernetes", out):
        if name not in limits.allowed_image_pull_secrets:
            out.append(
                f"kubernetes.image_pull_secrets {name!r} is not allowed (widen with "
                f"{_where('allowed_image_pull_secrets')})"
            )
    env, labels, tolerations = _placement(kube, "kubernetes", out)
    for name in sorted(set(env) - set(limits.allowed_env)):
        out.append(f"kubernetes.env.{name} is not allowed (widen with {_where('allowed_env')})")
    for key, value in sorted(labels.items()):
        if not {f"{key}={value}", str(key)} & set(limits.allowed_node_selectors):
            out.append(
                f"kubernetes.node_selector {key}={value} is not allowed (widen with "
                f"{_where('allowed_node_selectors')})"
            )
    tolerable = set(limits.allowed_toleration_keys)
    for key in sorted({_toleration_key(t) for t in tolerations} - tolerable):
        what = "every taint (a toleration without a key)" if key == "*" else f"the taint key {key!r}"
        out.append(
            f"kubernetes.tolerations may not tolerate {what} (widen with {_where('allowed_toleration_keys')})"
        )
    if kube.get("interruptible") and (spot := sorted(_spot_keys() - tolerable)):
        out.append(
            f"kubernetes.interruptible tolerates the spot taints {spot}, which are not allowed (widen "
            f"with {_where('allowed_toleration_keys')})"
        )
    return out + _gpu_refusals(kube, limits)
