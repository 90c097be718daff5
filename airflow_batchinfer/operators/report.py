"""``PreflightOperator`` (a sample before the fan-out: :func:`preflight_check`, which the factory
DAG's first round plan runs itself) and ``RunReportOperator`` (the final report)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Asset, BaseOperator, Context

from airflow_batchinfer.assets import results_event
from airflow_batchinfer.compat import AirflowFailException
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.hooks.aws import storage_options_from_aws_conn
from airflow_batchinfer.operators.pool import hold_pool, lease_id
from airflow_batchinfer.operators.shard import max_map_length
from airflow_batchinfer.pools import require_endpoints
from airflow_batchinfer.run.preflight import retry_warnings, run_preflight
from airflow_batchinfer.run.report.build import INCOMPLETE, build_report
from airflow_batchinfer.run.report.render import shard_summary
from airflow_batchinfer.run.sizing_plan import SizingPlan
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs.shard_status import RoundShards
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.state.owner import owned_run_config


class PreflightOperator(BaseOperator):
    """Run ``preflight_records`` (run settings) through infer and judge, log the projection and the
    sizing plan (shards, waves, tail idle, GPU-hours per round, Airflow pool size: what
    ``batchinfer plan`` prints, from the measured rates), and fail the run when the projection exceeds
    ``budget_gpu_hours``. ``preflight_records=0`` turns it off."""

    template_fields = ("run_root", "worker_pool", "aws_conn_id")
    ui_color = "#fde2e4"

    def __init__(self, *, run_root: str, worker_pool: str, aws_conn_id: str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.run_root = run_root
        self.worker_pool = worker_pool
        self.aws_conn_id = aws_conn_id

    def execute(self, context: Context) -> dict[str, Any] | None:
        so = storage_options_from_aws_conn(self.aws_conn_id)
        cfg = owned_run_config(self.run_root, context, so)
        return preflight_check(cfg, self.worker_pool, context, so, self.log)


def preflight_check(
    cfg: RunConfig, worker_pool: str, context: Context, so: dict[str, Any], log: Any
) -> dict[str, Any] | None:
    """The pre-flight (``PreflightOperator``, and the factory DAG's first round plan): log what the
    settings warn of (:func:`~airflow_batchinfer.run.preflight.retry_warnings`), run the sample on the
    run's pool (judged on the judge's own pool, if any), log the projection and the sizing plan, and
    fail the run when the projection exceeds ``budget_gpu_hours``."""
    for warning in retry_warnings(cfg):  # of the settings alone: also with the sample off
        log.warning("pre-flight: %s", warning)
    if cfg.budget.preflight_records <= 0:
        log.info("pre-flight is off (preflight_records=0)")
        return None
    pool = hold_pool(worker_pool, context, log)
    judge = None
    if cfg.judging.judge_pool:  # the judge's own pool judges the sample
        judge_pool = hold_pool(cfg.judging.judge_pool, context, log)
        judge = (require_endpoints(judge_pool, lease_id(context)), judge_pool.token())
    urls = require_endpoints(pool, lease_id(context))
    try:
        s = run_preflight(cfg, urls, pool.token(), so, max_map_length=max_map_length(), judge_pool=judge)
    except ConfigError as exc:  # the run's sampling, refused by the pool's engine: no retry helps
        raise AirflowFailException(str(exc)) from exc
    log.info(
        "pre-flight on %d records: %.1f tokens/s, approval %.0f%%; projected for %d records over the "
        "expected rounds (%.2f passes each): %.0f s wall, %.3f GPU-hours on %d workers",
        s.sample_records,
        s.tokens_per_s,
        100 * s.approval_rate,
        s.dataset_records,
        s.expected_passes_per_record,
        s.projected_wall_s,
        s.projected_gpu_hours,
        s.workers,
    )
    if "error" in s.sizing:
        log.warning("no sizing plan: %s", s.sizing["error"])
    else:
        log.info("sizing from the measured rates:\n%s", SizingPlan.from_dict(s.sizing).table())
    if cfg.budget.budget_gpu_hours is not None and s.projected_gpu_hours > cfg.budget.budget_gpu_hours:
        raise AirflowFailException(
            f"projected {s.projected_gpu_hours} GPU-hours exceeds the budget of "
            f"{cfg.budget.budget_gpu_hours}. "
            "Remedy: raise budget_gpu_hours, lower max_rounds, or sample fewer records."
        )
    return s.to_json()


class RunReportOperator(BaseOperator):
    """Write ``report/summary.json``, ``report/report.md`` and plots; fail the run when quarantined
    shards exceed ``max_failed_shards`` or an id is lost, else emit an event on each Asset outlet (the
    factory's :func:`~airflow_batchinfer.assets.results_asset`) with
    :func:`~airflow_batchinfer.assets.results_event` as its ``extra``."""

    template_fields = ("run_root", "aws_conn_id")
    ui_color = "#d9ead3"

    def __init__(self, *, run_root: str, aws_conn_id: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("trigger_rule", "all_done")
        super().__init__(**kwargs)
        self.run_root = run_root
        self.aws_conn_id = aws_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        so = storage_options_from_aws_conn(self.aws_conn_id)
        cfg = owned_run_config(self.run_root, context, so)
        report = write_report(cfg, so, self.log)
        failed = report_failure(cfg, report)
        if failed is not None:
            raise AirflowFailException(failed)
        for outlet in self.outlets:  # the factory's: results_asset(dag_id)
            if isinstance(outlet, Asset):
                context["outlet_events"][outlet].extra = results_event(report, cfg.data.output_format)
        return report_result(report)


def write_report(cfg: RunConfig, so: dict[str, Any], log: Any) -> dict[str, Any]:
    """Write the run's report (:func:`~airflow_batchinfer.run.report.build.build_report`) and log its outcome
    and each round's shard states: the report task's work, and that of the close that finishes a
    run (:class:`~airflow_batchinfer.operators.rounds.CloseRoundOperator` folds the tail)."""
    report = build_report(cfg, so)
    log.info(
        "run %s: %s (%s); approved %d, pending %d; report: %s/report.md",
        cfg.run_root,
        report["status"],
        report["stop_reason"],
        report["approved"],
        report["remaining_pending"],
        RunLayout(cfg.run_root).report,
    )
    for rs in report["shard_status"]:  # the grid shows one box per lane: each shard's state is here
        log.info("%s", shard_summary(RoundShards.model_validate(rs)))
    return report


def report_result(report: dict[str, Any]) -> dict[str, Any]:
    """The report task's return value (XCom)."""
    return {k: report[k] for k in ("status", "stop_reason", "approved", "remaining_pending")}


def report_failure(cfg: RunConfig, report: dict[str, Any]) -> str | None:
    """Why the run fails, with the remedy (the report task fails with it), or ``None``: a run some
    of whose slots never planned or closed, an id lost or doubled, more quarantined shards than
    ``max_failed_shards``."""
    layout = RunLayout(cfg.run_root)
    if report["status"] == INCOMPLETE:
        return (
            f"{report['stop_reason']}. Remedy: see the failed task's log (shard, pool_setup, a plan or a "
            "close), fix it and clear the DAG run: finished work is reused."
        )
    if not report["invariant"]["ok"]:
        return f"ids lost or doubled: {report['invariant']}; see {layout.report}"
    if report["status"] == "failed_shards":
        return (
            f"{len(report['failed_shards'])} shards quarantined (budget max_failed_shards="
            f"{cfg.budget.max_failed_shards}): {[f['shard_id'] for f in report['failed_shards']]}. "
            "Remedy: see "
            f"{layout.report}/report.md for each shard's error, fix it and re-run; finished shards are "
            "reused."
        )
    return None
