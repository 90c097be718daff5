"""The trust check at the start of a run: the DAG run's params against what the deployment allows.

The decision is :func:`airflow_batchinfer.spec.limits.refusals`; this module only gathers its inputs
where a task runs: the run's params, the provider's ``[batchinfer]`` config section and the
``batchinfer_pool`` connection the params name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow.sdk import BaseHook, Context

from airflow_batchinfer.compat import AirflowFailException, AirflowNotFoundException
from airflow_batchinfer.exceptions import ConfigError, ParamsRefused
from airflow_batchinfer.hooks.pool import BatchInferPoolHook
from airflow_batchinfer.pools.ref import PoolRef
from airflow_batchinfer.spec.limit_settings import CONFIG_SECTION, SETTINGS
from airflow_batchinfer.spec.limits import TriggerLimits, cap_refusals, refusals


def config_limits() -> TriggerLimits:
    """The limits in the provider's config section (``airflow.cfg`` or ``AIRFLOW__BATCHINFER__*``)."""
    from airflow.configuration import conf

    values = {s.name: conf.get(CONFIG_SECTION, s.name, fallback=None) for s in SETTINGS}
    # An option left unset reads as its declared default: None, or "None" once written out.
    set_ = {k: v for k, v in values.items() if v is not None and str(v).strip() not in ("", "None")}
    return TriggerLimits.from_mapping(set_, f"[{CONFIG_SECTION}]")


def check_params(
    context: Context,
    dag_limits: TriggerLimits | None,
    *,
    run_root: str | None = None,
    params: Mapping[str, Any] | None = None,
) -> TriggerLimits:
    """Refuse (fail the task, no retries) a run whose params go beyond ``dag_limits`` widened by the
    deployment's; returns the limits in force (the pool's workers allow their judge callables).
    ``params``: the params the task runs with (the run's pinned ones); ``None``: the context's.
    ``dag_limits`` ``None`` (a task built without ``limits=``: its DAG's code vouches for its paths,
    pools and engines): only the caps are checked (:func:`~airflow_batchinfer.spec.limits.cap_refusals`),
    the deployment's and the pool connection's, which hold for every DAG."""
    params = dict(context.get("params") or {}) if params is None else dict(params)
    limits = config_limits() if dag_limits is None else dag_limits.widen(config_limits())
    # A pool connection's extra widens only what runs on that pool: the run pool's connection the
    # run's settings, the judge pool's connection the judge pool's own (never the run's input).
    per_pool = {"worker_pool": limits, "judge_pool": limits}
    is_connection: dict[str, bool] = {}
    try:
        for name in per_pool:
            if not params.get(name):
                continue
            ref = PoolRef.parse(str(params[name]))
            if ref.needs_connection:
                try:
                    conn = BaseHook.get_connection(ref.name)
                except AirflowNotFoundException as exc:
                    raise ParamsRefused([f"{name} {ref.name!r}: no such connection"]) from exc
                is_connection[name] = conn.conn_type == BatchInferPoolHook.conn_type
                if is_connection[name]:
                    extra = TriggerLimits.from_mapping(conn.extra_dejson or {}, f"connection {ref.name!r}")
                    per_pool[name] = per_pool[name].widen(extra)
        limits = per_pool["worker_pool"]
        named = is_connection.get
        if dag_limits is None:
            reasons = cap_refusals(params, limits, judge_limits=per_pool["judge_pool"])
        else:
            reasons = refusals(
                params,
                limits,
                run_root=run_root,
                pool_is_connection=named("worker_pool", False),
                judge_limits=per_pool["judge_pool"],
                judge_pool_is_connection=named("judge_pool", False),
            )
        if reasons:
            raise ParamsRefused(reasons)
    except ConfigError as exc:
        raise AirflowFailException(
            f"{exc}. Nothing was started or written. Remedy: trigger with allowed values, or ask whoever "
            "deploys the DAG to widen its limits (docs: Security model)."
        ) from exc
    return limits
