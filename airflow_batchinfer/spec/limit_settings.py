"""The deployment's limits on trigger params, described once: each limit's name, kind and help
(:data:`SETTINGS`: the provider's config section, the ``batchinfer_pool`` connection's form and the
docs derive from it), who may call a Kubernetes pool's workers (:data:`POOL_NETWORK_SETTINGS`), and
how a value of each kind is read from a config file, a connection's extra or a DAG's ``limits=``.

``get_provider_info`` imports this module in every Airflow process: it imports nothing but the
standard library, the exception tree and the settings' shape (:mod:`~airflow_batchinfer.fields`) at
module level. What the limits decide is
:mod:`~airflow_batchinfer.spec.limits`'."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.fields import Described

# count: a whole number; quantity: a Kubernetes quantity (``8``, ``500m``, ``32Gi``); both caps, unset
# (``None``) is no cap
Kind = Literal["prefixes", "names", "count", "quantity"]
CAP_KINDS = ("count", "quantity")


@dataclass(frozen=True, kw_only=True)
class LimitSetting(Described):
    """One limit (:class:`~airflow_batchinfer.fields.Described`): its name (the config key, the
    connection extra key and the field), type (:data:`Kind`) and help. ``unset_default_of``: a cap
    that holds even where no one sets it, at the default of the run setting it names (a trigger may
    lower that setting, not raise it); ``default``: a cap that holds unset at that number; neither:
    unset is no cap."""

    type: Kind
    unset_default_of: str | None = None


def _limit(name: str, type_: Kind, help_: str, **kw: Any) -> LimitSetting:
    return LimitSetting(name=name, type=type_, help=help_, **kw)


# The one description of every limit: the dataclass below, the provider's config section, the
# connection form and the docs derive from it.
SETTINGS: tuple[LimitSetting, ...] = (
    _limit("allowed_input_prefixes", "prefixes",
                 "storage locations the `input` param may name (the pool's workers may read them: round 0 "
                 "reads the input in place)"),
    _limit("allowed_output_prefixes", "prefixes",
                 "storage locations `output_root` may name (the run root is written there, by the "
                 "pool's workers too)"),
    _limit("allowed_worker_pools", "names",
                 "pool references `worker_pool` may name besides the DAG's default and any "
                 "`batchinfer_pool` connection (`local://` allows every local pool, "
                 "`kubernetes://NAMESPACE/` every pool of a namespace)"),
    _limit("allowed_engines", "names",
                 "engines `engine` may name besides the DAG's default (the `openai` engine sends prompts "
                 "where its `base_url` points)"),
    _limit("allowed_models", "names",
                 "models `model` may name besides the DAG's default (a path on the workers, or "
                 "`builtin:smollm2`; an entry ending in `/` allows a directory)"),
    _limit("allowed_adapters", "names",
                 "LoRA adapter directories `adapters` may name besides the DAG default's (paths on the "
                 "workers, compared as their real paths; an entry ending in `/` allows a directory)"),
    _limit("allowed_engine_options", "names",
                 "`engine_options` keys a trigger may set besides those the DAG's default sets (keys "
                 "such as `trust_remote_code` or `base_url` only when listed)"),
    _limit("allowed_images", "names",
                 "worker images `kubernetes.image` may name (an entry ending in `:` or `/` allows "
                 "every tag or every image under it)"),
    _limit("allowed_storage_secrets", "names", "Secrets `kubernetes.storage_secret` may mount"),
    _limit("allowed_engine_secrets", "names",
                 "Secrets `kubernetes.engine_secret` may give the engine its secret options from "
                 "(`api_key`, `default_headers` of the `openai` engine, one key each)"),
    _limit("allowed_model_pvcs", "names", "volume claims `kubernetes.model_pvc` may mount"),
    _limit("allowed_service_accounts", "names",
                 "ServiceAccounts `kubernetes.service_account` may run the worker pods as (the cloud "
                 "identity their storage access comes from, by IRSA or Workload Identity)"),
    _limit("allowed_image_pull_secrets", "names",
                 "Secrets `kubernetes.image_pull_secrets` may name to pull the worker image with"),
    _limit("allowed_node_selectors", "names",
                 "`kubernetes.node_selector` labels a trigger may set besides the DAG default's: "
                 "`key=value`, or `key` for any value of that label"),
    _limit("allowed_toleration_keys", "names",
                 "taint keys `kubernetes.tolerations` may tolerate besides the DAG default's (`*`: "
                 "a toleration without a key, which tolerates every taint)"),
    _limit("allowed_env", "names",
                 "variable names `kubernetes.env` may set besides those the DAG's default sets (a "
                 "variable overrides the same key of the `storage_secret`, and can change what the "
                 "image runs: `AWS_ENDPOINT_URL`, `LD_PRELOAD` only when listed)"),
    _limit("allowed_judge_callables", "names",
                 "`module:function` targets a `callable` judge may name (an entry ending in `.` or "
                 "`:` allows a package or a module); the pool's workers allow the same"),
    _limit("shared_run_root_dags", "names",
                 "DAG ids whose runs may take over each other's finished run roots (a run root belongs "
                 "to the DAG that created it: a run of another DAG is refused, so one who may trigger "
                 "only DAG `a` cannot name DAG `b`'s `output_root` and `run_name` to read and rewrite "
                 "its results; list DAGs here only if their triggerers and readers are the same people)"),
    _limit("max_replicas", "count", "the most workers `replicas` may ask for"),
    _limit("max_gpus", "count", "the most GPUs per worker `kubernetes.gpus` may ask for"),
    # the size of the work a run puts on a (shared) pool: caps, checked like max_replicas
    _limit("max_concurrency", "count",
                 "the most shard jobs per worker `concurrency` and `judge_concurrency` may ask for"),
    _limit("max_records_per_shard", "count",
                 "the most records per shard `records_per_shard` may ask for, counted as rows: with "
                 "`fan_out` a record is a row per arm, and a shard holds whole records"),
    _limit("max_chunk_size", "count", "the most records a job holds per step `chunk_size` may ask for"),
    _limit("max_max_attempts", "count", "the most attempts per sample `max_attempts` may ask for"),
    _limit("max_target_batch_tokens", "count",
                 "the most tokens per engine batch `target_batch_tokens` may ask for"),
    _limit("max_max_tokens", "count",
                 "the most tokens per completion `sampling.max_tokens` (unset: 256), a `retry_sampling` "
                 "entry's and an `llm` judge's `max_tokens` may ask for"),
    _limit("max_preflight_records", "count", "the most records `preflight_records` may try"),
    # what multiplies the work of every record: one param asks for thousands of completions per
    # record, so these hold unset (at `default`; a DAG default above it raises it)
    _limit("max_adapters", "count",
                 "the most LoRA adapters `adapters` may name (with `fan_out` each is an arm: every record "
                 "runs once per arm; unset: 64)",
                 default=64),
    _limit("max_jury_members", "count",
                 "the most judges `judge` may judge each answer with, counted to the leaves of its "
                 "`jury`, `all` and `any` (each `llm` one is a completion per answer and candidate; "
                 "unset: 9)",
                 default=9),
    # input bounds: a larger one lets a line (an id) be held whole, so unset caps them at the default
    _limit("max_max_line_bytes", "count",
                 "the longest input line, in bytes, `max_line_bytes` may allow (unset: that setting's "
                 "default, so a trigger may lower the bound but not raise it)",
                 unset_default_of="max_line_bytes"),
    _limit("max_max_id_bytes", "count",
                 "the longest record id, in UTF-8 bytes, `max_id_bytes` may allow (unset: that setting's "
                 "default, so a trigger may lower the bound but not raise it)",
                 unset_default_of="max_id_bytes"),
    _limit("max_idle_ttl_s", "count",
                 "the longest idle time, in seconds, `idle_ttl_s` may keep a pool's workers up"),
    _limit("max_cpu", "quantity",
                 "the most CPU per worker `kubernetes.cpu` may request (a Kubernetes quantity: `8`, "
                 "`500m`; unset in the param: the pool's 4)"),
    _limit("max_memory", "quantity",
                 "the most memory per worker `kubernetes.memory` may request (a Kubernetes quantity: "
                 "`64Gi`; unset in the param: the pool's 32Gi)"),
    _limit("max_shm_size", "quantity",
                 "the most shared memory per GPU worker `kubernetes.shm_size` may ask for (a Kubernetes "
                 "quantity: `16Gi`; unset in the param: the pool's 8Gi)"),
)  # fmt: skip
SETTINGS_BY_NAME: dict[str, LimitSetting] = {s.name: s for s in SETTINGS}
CONFIG_SECTION = "batchinfer"


@dataclass(frozen=True, kw_only=True)
class PoolNetworkSetting(Described):
    """Who may call a Kubernetes pool's workers (:class:`~airflow_batchinfer.fields.Described`, with
    an example value): a ``[batchinfer]`` key and the ``batchinfer_pool`` connection's extra key of
    the same name (it wins), never a trigger param
    (:class:`~airflow_batchinfer.pools.kubernetes.spec.RpcPeers` reads them)."""

    example: str


def _network(name: str, example: str, help_: str) -> PoolNetworkSetting:
    return PoolNetworkSetting(name=name, example=example, help=help_)


# The one description of each: the provider's config section, the connection form and the docs
# derive from it.
POOL_NETWORK_SETTINGS: tuple[PoolNetworkSetting, ...] = (
    _network("rpc_from", '{"matchLabels": {"release": "airflow"}}',
                       "the Airflow pods that may call a Kubernetes pool's workers, as a label selector "
                       "(JSON): the pool's NetworkPolicy admits only them to its RPC port (unset: the "
                       "Helm chart's `tier: airflow` pods whose `component` is `worker`, `triggerer`, "
                       "`scheduler` or `api-server`; an empty selector is refused)"),
    _network("rpc_from_namespace", "airflow",
                       "the namespace those pods run in (unset: the pool's own)"),
)  # fmt: skip


def matches(entry: str, value: str) -> bool:
    """An allow-list entry admits ``value`` when equal, or as a prefix when it ends in ``/ : .``."""
    return value == entry or (entry[-1:] in ("/", ":", ".") and value.startswith(entry))


def parse_names(value: Any, what: str) -> tuple[str, ...]:
    """A list, or comma-separated text (config files and connection forms hold text)."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, Iterable):
        raise ConfigError(f"{what}: expected a list or comma-separated text, got {value!r}")
    return tuple(str(v).strip() for v in items if str(v).strip())


def parse_count(value: Any, what: str) -> int | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what}: expected a whole number, got {value!r}") from None
    if number < 0:
        raise ConfigError(f"{what}: must be >= 0, got {number}")
    return number


def parse_quantity_cap(value: Any, what: str) -> str | None:
    """A Kubernetes quantity cap, kept as written (``32Gi``) once it parses."""
    from airflow_batchinfer.pools.kubernetes.spec import parse_quantity

    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    parse_quantity(value, what)
    return str(value).strip()


def cap_amount(value: Any) -> Decimal:
    """A cap's value as a number: a count, or a quantity's units (cores, bytes)."""
    from airflow_batchinfer.pools.kubernetes.spec import parse_quantity

    return Decimal(value) if isinstance(value, int) else parse_quantity(value, "a cap")


def unset_cap(cap_name: str) -> int | None:
    """The cap in force where no limit sets ``cap_name``: its own ``default``, the default of the run
    setting its :attr:`LimitSetting.unset_default_of` names, or ``None`` (no cap)."""
    s = SETTINGS_BY_NAME[cap_name]
    of = s.unset_default_of
    if of is None:
        return None if s.default is None else int(s.default)
    from airflow_batchinfer.spec.settings import setting  # the one default (settings imports more)

    return int(setting(of).default)


def where_set(setting: str) -> str:
    """Where a deployment sets the limit ``setting``: each refusal's remedy names them."""
    return (
        f"the DAG's limits, the [{CONFIG_SECTION}] {setting} setting, or the pool connection's extra "
        f"{setting}"
    )
