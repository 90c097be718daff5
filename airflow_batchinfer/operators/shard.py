"""``ShardDatasetOperator``: the run's first task. Validates the run settings, claims the run root
for this DAG run (``owner.json``: a root another live DAG run owns, or another DAG created, is
refused, and so is an ``input`` inside a root another DAG created), plans round 0's shards (byte
ranges of the input, a few KB read per shard and nothing copied; input that cannot be split, such
as single-frame zstd, is copied into shards; reused when identical), stores ``run.json`` and returns
a summary of the plan (shards, records, where its manifest is): the shards' references live in the
input's manifest, which every later task reads."""

from __future__ import annotations

import errno
from typing import Any

from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowException

from airflow_batchinfer.compat import AirflowFailException
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.hooks.aws import storage_options_from_aws_conn
from airflow_batchinfer.judges.truncation import tightest_cap
from airflow_batchinfer.operators.limits import check_params
from airflow_batchinfer.run.prepare import prepare_run
from airflow_batchinfer.run.sizing import lanes_at_once
from airflow_batchinfer.spec.limits import TriggerLimits
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.state.owner import (
    RunIdentity,
    claim,
    input_refusal,
    nesting_refusal,
    owner_uri,
    parts_refusal,
)
from airflow_batchinfer.storage.input_parts import InputParts, list_input
from airflow_batchinfer.storage.location import join
from airflow_batchinfer.storage.manifest import MANIFEST_NAME
from airflow_batchinfer.storage.shard_ref import RangeRef

# Storage full or read-only: retrying the same write will not help until someone frees space.
NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG)


def rendered_dict(value: object, what: str) -> dict[str, Any]:
    """A templated field that must have rendered to a dict (the DAG renders native objects)."""
    if not isinstance(value, dict):
        raise AirflowFailException(f"{what} must render to an object, got {value!r}")
    return value


def max_map_length() -> int:
    from airflow.configuration import conf

    return conf.getint("core", "max_map_length", fallback=1024)


def dagrun_state(ti: Any, run: RunIdentity) -> str | None:
    """The state of another DAG run through the task SDK (``None``: no such run)."""
    from airflow.sdk.exceptions import AirflowRuntimeError

    try:
        state = ti.get_dagrun_state(run.dag_id, run.run_id)
        return str(getattr(state, "value", state))  # a DagRunState enum or its value
    except AirflowRuntimeError as exc:
        detail = getattr(getattr(exc, "error", None), "detail", None) or {}
        if isinstance(detail, dict) and detail.get("status_code") == 404:
            return None
        raise AirflowException(
            f"cannot read the state of DAG run {run}, which owns this run root: {exc}. "
            "Airflow retries the task."
        ) from exc


class ShardDatasetOperator(BaseOperator):
    """:param config: the run settings (flat, as ``RunConfig.of`` takes them; templated, so DAG params fit).
    :param run_params: the DAG run's params as the run's ``pin`` task rendered them (templated): the
        ones checked against ``limits``; ``None``: the context's.
    :param aws_conn_id: AWS connection for ``s3://`` input and run roots.
    :param slots: the pool's job slots, ``replicas × concurrency`` (templated, as the plan task's):
        round 0's lanes at once (the run setting ``lanes``, at most ``slots``; 0: ``slots``), for
        which the input's last shards taper (:mod:`~airflow_batchinfer.storage.taper`); ``None``: no
        taper. A round maps lanes, not shards: Airflow's ``max_map_length`` does not bound the shards.
    :param limits: check the DAG run's params against these (widened by the deployment's) before
        anything is read or written (:mod:`airflow_batchinfer.spec.limits`); ``None``: the DAG's code
        vouches for ``config`` and callable judges are not restricted here, but the params are held
        to the deployment's caps (``[batchinfer] max_*``, the pool connection's)."""

    template_fields = ("config", "run_params", "aws_conn_id", "slots")
    ui_color = "#fdf5e6"

    def __init__(
        self,
        *,
        config: dict[str, Any] | str,
        run_params: dict[str, Any] | str | None = None,
        aws_conn_id: str | None = None,
        limits: TriggerLimits | None = None,
        slots: int | str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.slots = slots
        self.limits = limits
        self.config = config
        self.run_params = run_params
        self.aws_conn_id = aws_conn_id

    def _lanes(self, cfg: RunConfig) -> int:
        """Round 0's lanes at once, for which the input's last shards taper (0: none)."""
        if self.slots is None:
            return 0
        try:
            slots = int(str(self.slots))
        except ValueError:
            slots = 0
        if slots < 1:
            raise AirflowFailException(
                f"the pool's slots (replicas x concurrency) must be a whole number >= 1, got {self.slots!r}. "
                "Remedy: set the params replicas and concurrency to positive whole numbers"
            )
        return lanes_at_once(cfg.sharding.lanes, slots)

    def _check_input(
        self, cfg: RunConfig, context: Context, so: dict[str, Any], limits: TriggerLimits
    ) -> InputParts | None:
        """Refuse an ``input`` inside a run root another DAG created (unless the limit in force lets the
        two share): its results would become this run's rows, shown on this run's review desk. A
        directory or glob is listed here, each part's directories checked too (a wildcard hides
        them from the input's own ancestors); the listing is returned for planning (not listed twice)."""
        ti = context.get("ti") if hasattr(context, "get") else None
        if ti is None or not getattr(ti, "run_id", None):
            return None  # no DAG run to compare with (as for the claim)
        me = RunIdentity(ti.dag_id, ti.run_id)
        why = input_refusal(
            cfg.data.input,
            me,
            so,
            prefixes=limits.allowed_input_prefixes,
            shared_dags=limits.shared_run_root_dags,
        )
        if why is not None:
            raise AirflowFailException(why)
        listed = list_input(cfg.data.input, so)
        why = parts_refusal(
            listed, me, so, prefixes=limits.allowed_input_prefixes, shared_dags=limits.shared_run_root_dags
        )
        if why is not None:
            raise AirflowFailException(why)
        return listed

    def _claim(self, cfg: RunConfig, context: Context, so: dict[str, Any], limits: TriggerLimits) -> None:
        """Record this DAG run as the run root's owner; refuse a root another live run owns, or
        another DAG created (unless both are in ``shared_run_root_dags``, the limit in force), and a
        new root inside or around such a DAG's root."""
        ti = context.get("ti") if hasattr(context, "get") else None
        if ti is None or not getattr(ti, "run_id", None):
            self.log.warning("no DAG run in the context: %s is not claimed", owner_uri(cfg.run_root))
            return
        me = RunIdentity(ti.dag_id, ti.run_id)
        shared_dags = limits.shared_run_root_dags
        why = nesting_refusal(
            cfg.run_root, me, so, prefixes=limits.allowed_output_prefixes, shared_dags=shared_dags
        )
        if why is not None:
            raise AirflowFailException(why)
        decision = claim(
            cfg.run_root,
            me,
            lambda run: dagrun_state(ti, run),
            so,
            shared_dags=shared_dags,
            extra={"try_number": getattr(ti, "try_number", None)},
        )
        if decision.action == "refuse":
            raise AirflowFailException(decision.reason)
        self.log.info("%s (%s)", decision.reason, owner_uri(cfg.run_root))

    def execute(self, context: Context) -> dict[str, Any]:
        so = storage_options_from_aws_conn(self.aws_conn_id)
        try:
            cfg = RunConfig.from_dict(dict(rendered_dict(self.config, "config")))
            # without the DAG's limits its code vouches for config, but the deployment's caps still hold
            limits = check_params(
                context,
                self.limits,
                run_root=cfg.run_root,
                params=None if self.run_params is None else rendered_dict(self.run_params, "run_params"),
            )
            # retries of truncated samples are never raised above the deployment's max_max_tokens
            cfg = cfg.replace(max_tokens_cap=tightest_cap(cfg.retries.max_tokens_cap, limits.max_max_tokens))
            callables = None if self.limits is None else limits.allowed_judge_callables
            cfg.validate(callables=callables)  # before anything is written, the owner record included
            listed = self._check_input(cfg, context, so, limits)
            self._claim(cfg, context, so, limits)
            self.log.info(
                "sharding %s into %s (%d records per shard)",
                cfg.data.input,
                RunLayout(cfg.run_root).input,
                cfg.sharding.records_per_shard,
            )
            result = prepare_run(cfg, so, lanes=self._lanes(cfg), listed=listed)
        except ConfigError as exc:
            raise AirflowFailException(f"bad run settings: {exc}") from exc
        except OSError as exc:
            if exc.errno not in NO_SPACE:
                raise
            root = str(rendered_dict(self.config, "config").get("run_root"))
            raise AirflowFailException(
                f"cannot write the run under {root}: {exc.strerror or exc} (errno {exc.errno}"
                f"{', ' + exc.filename if exc.filename else ''}). Nothing half-written is visible: files "
                "commit atomically. Remedy: free space (or make it writable) under the output root, then "
                "clear this DAG run; finished steps are reused."
            ) from exc
        reused = "reused: " if result.reused else ""
        if fan_out := cfg.prompt.fan_out_arms():  # the rows the rounds run: each record once per arm
            rows = sum(s.records for s in result.shards)
            self.log.info(
                "fan_out %s: about %d rows, ids ID@ARM (%s)",
                cfg.prompt.fan_out,
                rows,
                ", ".join(fan_out.arms),
            )
        if result.shards and result.shards[0].is_range:
            parts = {p.uri for s in result.shards if isinstance(s, RangeRef) for p in s.pieces or ()}
            self.log.info(
                "%s%d range shards of %s%s, about %d records (nothing copied: each range is "
                "validated by the job that reads it; bad lines go to %s when round 0 closes)",
                reused,
                len(result.shards),
                cfg.data.input,
                f" ({len(parts)} parts read in place)" if parts else "",
                result.counts.get("records", 0),
                result.rejects_uri,
            )
        else:
            self.log.info(
                "%s%d shards, counts %s; quarantined lines in %s",
                reused,
                len(result.shards),
                result.counts,
                result.rejects_uri,
            )
        # XCom: a summary, never the refs: a 100k-part input's plan is megabytes, and every later
        # task reads the plan from the input's manifest.
        return {
            "shards": len(result.shards),
            "records": sum(s.records for s in result.shards),
            "estimated": any(isinstance(s, RangeRef) and s.estimated for s in result.shards),
            "manifest": join(RunLayout(cfg.run_root).input, MANIFEST_NAME),
            "reused": result.reused,
        }
