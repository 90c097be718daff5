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
Airflow. Each limit is described in :mod:`~airflow_batchinfer.spec.limit_settings` (what
``get_provider_info`` reads, in every Airflow process); the checks of the work a run puts on its pool
and of its pods are :mod:`~airflow_batchinfer.spec.pool_limits`'. The pool facts the checks read
(quantities, a Kubernetes spec's keys, pool references) are imported where they are used: loading
the limits must not load the pools (the pools import nothing of this module).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.spec.limit_settings import (
    CAP_KINDS,
    SETTINGS,
    cap_amount,
    matches,
    parse_count,
    parse_names,
    parse_quantity_cap,
    unset_cap,
    where_set,
)
from airflow_batchinfer.spec.pool_limits import (
    WORK_COUNTS,
    gpu_refusals,
    kubernetes_refusals,
    placement,
    pull_secrets,
    replica_refusals,
    size_refusals,
    spot_keys,
    toleration_key,
)

SAFE_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")


def _larger(mine: Any, theirs: Any) -> Any:
    return theirs if cap_amount(theirs) > cap_amount(mine) else mine


@dataclass(frozen=True)
class TriggerLimits:
    """What trigger params may choose (see
    :data:`~airflow_batchinfer.spec.limit_settings.SETTINGS` for each field). Empty lists allow
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
    max_adapters: int | None = None  # None: the cap is the setting's default (64)
    max_jury_members: int | None = None  # None: the cap is the setting's default (9)
    max_max_line_bytes: int | None = None  # None: the cap is the setting's default (unset_default_of)
    max_max_id_bytes: int | None = None
    max_idle_ttl_s: int | None = None
    max_cpu: str | None = None  # Kubernetes quantities, as written
    max_memory: str | None = None
    max_shm_size: str | None = None

    def __post_init__(self) -> None:  # lists as tuples (hashable, and the same whatever was passed)
        for s in SETTINGS:
            if s.type == "quantity":  # checked here too: a DAG's limits= is built directly
                object.__setattr__(self, s.name, parse_quantity_cap(getattr(self, s.name), s.name))
            elif s.type != "count":
                object.__setattr__(self, s.name, parse_names(getattr(self, s.name), s.name))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None, source: str) -> TriggerLimits:
        """The limits among ``data``'s keys (other keys are ignored: a connection's extra holds more).
        ``source`` names where they come from, for errors."""
        data = data or {}
        values: dict[str, Any] = {}
        for s in SETTINGS:
            if s.name in data:
                what = f"{source}: {s.name}"
                parse = {"count": parse_count, "quantity": parse_quantity_cap}.get(s.type, parse_names)
                values[s.name] = parse(data[s.name], what)
        return cls(**values)

    @property
    def input_read_prefixes(self) -> tuple[str, ...]:
        """Where a pool's workers may read the inputs these limits allow: each allowed input prefix,
        a glob as its fixed directory (its range jobs' input and their parts' prefix, which the glob
        itself is not). A trigger's ``input`` is still checked against the prefixes as written."""
        from airflow_batchinfer.storage.input_parts import input_root

        return tuple(dict.fromkeys(input_root(p) for p in self.allowed_input_prefixes))

    def widen(self, other: TriggerLimits | None) -> TriggerLimits:
        """Both limits' allowances: lists joined, the larger maximum."""
        if other is None:
            return self
        values: dict[str, Any] = {}
        for s in SETTINGS:
            mine, theirs = getattr(self, s.name), getattr(other, s.name)
            if s.type in CAP_KINDS:
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
    env, labels, tolerations = placement(kube, "the DAG's default kubernetes")
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
        allowed_image_pull_secrets=pull_secrets(kube, "the DAG's default kubernetes"),
        allowed_node_selectors=tuple(f"{k}={v}" for k, v in labels.items()),
        allowed_toleration_keys=tuple(
            dict.fromkeys([*(toleration_key(t) for t in tolerations), *(spot_keys() if spot else ())])
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
        if s.unset_default_of is not None:
            value = parse_count(defaults.get(s.unset_default_of), f"the DAG's default {s.unset_default_of}")
        elif s.name in WORK_COUNTS:
            value = WORK_COUNTS[s.name](defaults)
        else:
            continue
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
            out.append(f"{what} {str(uri)!r} is outside {list(prefixes)} (widen with {where_set(setting)})")
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
            why = f"widen with {where_set('allowed_worker_pools')}"
            out.append(
                f"worker_pool {str(ref)!r} is not the DAG's pool, a batchinfer_pool connection "
                f"or allowed ({why})"
            )
    run_name = params.get("run_name")
    if run_name and (not SAFE_NAME.fullmatch(str(run_name)) or set(str(run_name)) == {"."}):
        out.append(f"run_name {run_name!r} must be one folder name (letters, digits, . _ - ; not . or ..)")
    engine = params.get("engine")
    if engine and not any(matches(e, str(engine)) for e in limits.allowed_engines):
        out.append(
            f"engine {engine!r} is not the DAG's nor allowed (widen with {where_set('allowed_engines')})"
        )
    if model := params.get("model"):
        out += _model_refusals(str(model), limits.allowed_models)
    for path in _adapter_paths(params.get("adapters")):
        out += _model_refusals(path, limits.allowed_adapters, "adapter", "allowed_adapters")
    options = params.get("engine_options") or {}
    out += _secret_option_refusals(options)
    for key in (
        sorted(set(options) - set(limits.allowed_engine_options)) if isinstance(options, Mapping) else []
    ):
        out.append(f"engine_options.{key} is not allowed (widen with {where_set('allowed_engine_options')})")
    for target in callable_targets(params.get("judge")):
        if not any(matches(e, target) for e in limits.allowed_judge_callables):
            out.append(
                f"judge callable {target!r} is not allowed (widen with "
                f"{where_set('allowed_judge_callables')})"
            )
    out += replica_refusals(params, limits)
    out += kubernetes_refusals(params.get("kubernetes") or {}, limits)
    out += size_refusals(params, limits)
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
    out += replica_refusals(params, limits)
    out += gpu_refusals(kube, limits) if isinstance(kube, Mapping) else []
    return out + size_refusals(params, limits)


def _model_refusals(
    model: str, allowed: tuple[str, ...], what: str = "model", setting: str = "allowed_models"
) -> list[str]:
    """Why ``model`` (or an adapter's directory) is refused: a local path compares as its normalised
    real path, by whole segments (``/models/../etc`` is ``/etc``, not under ``/models/``); other
    references as written (:func:`~airflow_batchinfer.worker.security.model_allows`, the workers' rules)."""
    from airflow_batchinfer.worker.security import is_path_model, model_allows, normalize_model

    widen = f"widen with {where_set(setting)}"
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
