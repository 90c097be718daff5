"""The round controller and the round close.

``RoundControllerOperator`` (one task per round slot, because Airflow allows one review request per
task instance and its body cannot change) reads what the previous rounds left, decides what this
slot does (see :func:`airflow_batchinfer.run.plan.propose`), and when review is on opens a review gate
on the Required Actions page whose body is the round summary. It returns what the slot's lane task is
expanded over: the round's lane descriptors (see :mod:`airflow_batchinfer.run.lanes`); an empty list
skips it.

``CloseRoundOperator`` runs whatever happened upstream (``trigger_rule=all_done``): Airflow drops a
failed index from a downstream ``.expand``, so it compares the shards the plan named with the job
manifests in storage and quarantines the missing ones (:func:`airflow_batchinfer.run.close.close_round`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.providers.common.compat.sdk import SkipMixin
from airflow.providers.standard.operators.hitl import HITLOperator
from airflow.sdk import Asset, AssetAlias, BaseOperator, Context

from airflow_batchinfer.assets import results_event
from airflow_batchinfer.compat import AirflowFailException
from airflow_batchinfer.exceptions import BatchInferError, ConfigError, RpcError
from airflow_batchinfer.hooks.aws import storage_options_from_aws_conn
from airflow_batchinfer.operators.gate_form import GATE_PARAM, desk, gate_params, read_answer
from airflow_batchinfer.operators.gate_pool import (
    REOPEN,
    answer_gate,
    as_replicas,
    engine_swapped,
    gate_start_refusal,
    open_gate,
    record_answer,
    record_warm,
    warm_failure,
    warm_trigger,
)
from airflow_batchinfer.operators.limits import check_params
from airflow_batchinfer.operators.pool import hold_pool, lease_id
from airflow_batchinfer.operators.report import preflight_check, report_failure, write_report
from airflow_batchinfer.operators.shard import max_map_length
from airflow_batchinfer.pools import WorkerPool
from airflow_batchinfer.rpc.pool import PoolClient
from airflow_batchinfer.run.close import close_round
from airflow_batchinfer.run.fold import fold_tail, next_slot
from airflow_batchinfer.run.gate.body import review_body
from airflow_batchinfer.run.gate.changes import current_settings, gate_changes
from airflow_batchinfer.run.lane_start import start_lanes
from airflow_batchinfer.run.lane_tail import take_back
from airflow_batchinfer.run.lanes import clear_claims, lane_count, lanes_of
from airflow_batchinfer.run.plan import (
    ACCEPT,
    CONTINUE,
    CONTINUE_IN_PLACE,
    STOP,
    apply_choice,
    load_snapshot,
    propose_slot,
)
from airflow_batchinfer.spec.limits import TriggerLimits
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import Plan, read_plan, write_plan
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.state.owner import owned_run_config
from airflow_batchinfer.worker.leases import DEFAULT_LEASE_TTL_S

DEFAULT_RESPONSE_TIMEOUT = timedelta(hours=24)
RETURN_VALUE = "return_value"  # the XCom key of a task's return value


class RoundControllerOperator(HITLOperator):
    """The plan task of one round slot, with its review gate.

    :param slot: ``round-NN`` or ``tail``.
    :param run_root: the run's root (templated).
    :param review_default: the answer taken when nobody answers within ``response_timeout``
        (``Stop`` by default: nothing more is spent without a person's decision).
    :param worker_pool: the run's pool: its lease is renewed here, to outlast the review gate (the
        workers stay warm however long the review takes), and dead local workers are restarted.
    :param preflight: run the pre-flight (:func:`~airflow_batchinfer.operators.report.preflight_check`)
        before a round that will run, as the factory DAG's first slot does: one task start less
        between the shard task and the fan-out than a ``PreflightOperator`` of its own.
    :param limits: the DAG's limits (widened by the deployment's and the pool connection's, as
        :func:`~airflow_batchinfer.operators.limits.check_params` computes them): a review answer that
        sets a setting over a cap (``max_tokens`` over ``max_max_tokens``) is refused, the task fails
        with the reason and nothing of the answer is applied. ``None``: the deployment's caps
        (``[batchinfer] max_*``, the pool connection's) hold all the same.
    :param slots: the pool's job slots, ``replicas × concurrency`` (templated: the factory passes the
        DAG params', the figure the Airflow pool's slots are sized to). The task returns the slot's
        lane descriptors (for :class:`~airflow_batchinfer.operators.lanes.ShardLaneOperator`), ``lanes``
        of them (the run setting; 0: ``slots``), never more than the round's shards nor
        ``[core] max_map_length``. ``None``: the run setting ``lanes`` must be set (not 0).
    :param replicas: the run's replicas (templated: the factory passes the DAG params'): what its
        lease holds again after a gate gave it back or put it to sleep (the run setting ``gate_idle``,
        :mod:`~airflow_batchinfer.operators.gate_pool`). ``None``: the gate keeps the lease (``keep``).
    :param ready_timeout_s: how long the answer waits (deferred) for a pool it re-warms.

    ``assigned_users``, ``response_timeout`` and ``notifiers`` go to the review gate."""

    template_fields = ("run_root", "aws_conn_id", "worker_pool", "slots", "replicas")
    ui_color = "#fff3cd"

    def __init__(
        self,
        *,
        slot: str,
        run_root: str,
        aws_conn_id: str | None = None,
        worker_pool: str | None = None,
        preflight: bool = False,
        review_default: str = STOP,
        response_timeout: timedelta | None = DEFAULT_RESPONSE_TIMEOUT,
        limits: TriggerLimits | None = None,
        slots: int | str | None = None,
        replicas: int | str | None = None,
        ready_timeout_s: float = 900.0,
        **kwargs: Any,
    ) -> None:
        kwargs.pop("params", None)  # the DAG's, merged in by Airflow: HITLOperator merges them again
        super().__init__(
            subject=f"Review before {slot}",
            options=[CONTINUE, CONTINUE_IN_PLACE, ACCEPT, STOP],
            defaults=[review_default],
            response_timeout=response_timeout,
            params=gate_params(),
            **kwargs,
        )
        self.slot = slot
        self.run_root = run_root
        self.aws_conn_id = aws_conn_id
        self.worker_pool = worker_pool
        self.preflight = preflight
        self.limits = limits
        self.slots = slots
        self.replicas = replicas
        self.ready_timeout_s = ready_timeout_s
        self._held: dict[str, WorkerPool] = {}  # the pools _start held, by plan field
        if preflight and not worker_pool:
            raise ValueError(f"{slot}: the pre-flight needs the run's worker_pool")

    def _mapped(self, cfg: RunConfig, plan: Plan) -> list[dict[str, Any]]:
        """The slot's lane descriptors (see ``slots``)."""
        if plan.mode == "skip" or not plan.shards:
            return []
        requested = plan.effective_config(cfg).sharding.lanes
        if self.slots is None and not requested:
            raise AirflowFailException(
                f"{self.slot}: the run setting lanes is 0 (one per pool slot), but this plan task was given "
                "no slots. Remedy: pass slots= (the pool's replicas x concurrency) to the plan task, or "
                "set the run setting lanes"
            )
        try:
            slots = requested if self.slots is None else int(str(self.slots))
            count = lane_count(requested, slots, len(plan.shards))
        except (ConfigError, ValueError) as exc:
            raise AirflowFailException(
                f"{self.slot}: {exc}. Remedy: set the run setting lanes (0: one per pool slot) and the "
                "pool's replicas and concurrency to positive numbers"
            ) from exc
        bound = max_map_length()
        if count > bound:
            raise AirflowFailException(
                f"{self.slot}: {count} lanes, but Airflow maps at most {bound} tasks per round "
                f"([core] max_map_length). Remedy: set the run setting lanes to at most {bound}, or raise "
                "max_map_length (AIRFLOW__CORE__MAX_MAP_LENGTH) on the scheduler and workers"
            )
        return lanes_of(plan, count)

    def _commit(
        self, cfg: RunConfig, plan: Plan, so: dict[str, Any], context: Context
    ) -> list[dict[str, Any]]:
        """Store the slot's plan and return what its mapped task is expanded over. A round that runs
        starts its lanes afresh: an earlier plan's claims and lane documents are forgotten (finished
        shards are not run again: their manifests are reused), and each lane's first job is submitted
        here, seconds before its lane task starts (see :mod:`~airflow_batchinfer.run.lane_start`)."""
        mapped = self._mapped(cfg, plan)  # a refusal stores nothing
        layout = RunLayout(cfg.run_root)
        write_plan(layout, plan, so)
        if plan.mode != "skip":
            clear_claims(layout, plan.round, so)
            if mapped:
                self._start_lanes(plan.effective_config(cfg), plan, mapped, so, context)
        return mapped

    def _start_lanes(
        self, cfg: RunConfig, plan: Plan, lanes: list[dict[str, Any]], so: dict[str, Any], context: Context
    ) -> None:
        """Each lane's first shard claimed and its job submitted (best effort: a lane runs whatever
        was not started here)."""
        pool = self._held.get("engine")
        if pool is None:
            return

        async def start() -> list[str]:
            client = PoolClient.for_pool(pool, lease_id=lease_id(context), storage_options=so)
            try:
                return await start_lanes(cfg, plan, lanes, client, so)
            finally:
                await client.aclose()

        try:
            started = asyncio.run(start())
        except (BatchInferError, OSError) as exc:  # the lanes take their shards themselves
            self.log.warning(
                "%s: lanes' first jobs not started here (%s); the lanes start them", self.slot, exc
            )
            return
        shown = ", ".join(started[:10]) + (" …" if len(started) > 10 else "")
        self.log.info(
            "%s: the first jobs of %d of %d lanes submitted: %s", self.slot, len(started), len(lanes), shown
        )

    def _pools(self, cfg: RunConfig) -> dict[str, str]:
        """The plan field each pool's engine is recorded in -> the pool: the run's, and the judge's own."""
        refs = {"engine": self.worker_pool, "judge_engine": cfg.judging.judge_pool}
        return {name: ref for name, ref in refs.items() if ref}

    def _hold_pools(self, cfg: RunConfig, context: Context, gate: bool) -> dict[str, WorkerPool]:
        wait = self.response_timeout.total_seconds() if gate and self.response_timeout else 0.0
        ttl = DEFAULT_LEASE_TTL_S + wait
        return {name: hold_pool(ref, context, self.log, ttl_s=ttl) for name, ref in self._pools(cfg).items()}

    def _start(self, cfg: RunConfig, plan: Plan, context: Context) -> None:
        """For a round about to run: keep the pools (restarting dead local workers) and record what
        they run in the plan, so the round's close counts only those engines' jobs."""

        async def engine(pool: WorkerPool) -> dict[str, Any]:
            client = PoolClient.for_pool(pool, lease_id=lease_id(context))
            try:
                return await client.engine()
            finally:
                await client.aclose()

        self._held = self._hold_pools(cfg, context, gate=False)
        if (own := self._held.get("engine")) is not None:  # a tail gave replicas back: the round's again
            take_back(
                own,
                lease_id(context),
                run_root=cfg.run_root,
                so=storage_options_from_aws_conn(self.aws_conn_id),
            )
        for name, pool in self._held.items():
            try:
                setattr(plan, name, asyncio.run(engine(pool)))
            except RpcError as exc:  # workers still starting: close then trusts each manifest's engine
                self.log.warning(
                    "%s: could not ask the pool what it runs (%s); not recorded in the plan", self.slot, exc
                )
        # a sampling field the pool's engine does not honour (in the settings this round runs, a
        # review's changes included), or a gate_idle the pool cannot hold: refused before the
        # round's jobs (and before any gate)
        running = plan.effective_config(cfg)
        refusal = running.engine_refusal(str(plan.engine["engine"])) if plan.engine else None
        refusal = refusal or running.pools_refusal(plan.engine, plan.judge_engine)
        if refusal is None and (own := self._held.get("engine")) is not None:
            refusal = gate_start_refusal(running, own, lease_id(context))
        if refusal is not None:
            raise AirflowFailException(f"bad run settings: {refusal}")

    def execute(self, context: Context) -> Any:
        so = storage_options_from_aws_conn(self.aws_conn_id)
        cfg = owned_run_config(self.run_root, context, so)
        proposal = propose_slot(cfg, self.slot, so)
        plan = proposal.plan
        if self.preflight and plan.mode != "skip" and self.worker_pool:
            preflight_check(cfg, self.worker_pool, context, so, self.log)  # fails a run over budget
        gpus = None
        if proposal.options:
            self._hold_pools(cfg, context, gate=True)
            gpus = self._open_gate(cfg, context, so)
        elif plan.mode != "skip":
            if cfg.reviews.review != "never" or cfg.human_review:  # an earlier gate may have released it
                self._take_pool_back(cfg, plan, so, context, "after an earlier gate", answered=False)
            self._start(cfg, plan, context)
        if not proposal.options:
            mapped = self._commit(cfg, plan, so, context)
            self.log.info(
                "%s: %s (%s)%s%s",
                self.slot,
                plan.mode,
                plan.reason,
                f"; the run stops: {plan.stop}" if plan.stop else "",
                self._lanes_note(plan, mapped),
            )
            return mapped
        self.options = proposal.options
        if self.defaults and not set(self.defaults) <= set(self.options):
            self.defaults = [STOP]
        for name, value in current_settings(plan.effective_config(cfg)).items():
            self.params[GATE_PARAM.format(name)] = value  # the form shows what the next round runs
        # the run's name, not its storage path: Airflow's Required Actions page shows the subject
        run = RunLayout(cfg.run_root).name
        self.subject = f"Round {plan.round}: review {plan.records or 'the'} pending records ({run})"
        self.body = review_body(cfg, proposal, so, desk=desk(context), gpus=gpus)
        self.log.info("%s: waiting for review (proposed: %s, %s)", self.slot, plan.mode, plan.reason)
        return super().execute(context)

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        payload = super().execute_complete(context, event)
        so = storage_options_from_aws_conn(self.aws_conn_id)
        cfg = owned_run_config(self.run_root, context, so)
        proposal = propose_slot(cfg, self.slot, so)
        choice, who, answered = read_answer(payload)
        changes = gate_changes(current_settings(proposal.plan.effective_config(cfg)), answered)
        # the caps a trigger's params are held to hold for what the answer changes (without the DAG's
        # limits, the deployment's: check_params decides which)
        # the limits in force now (the DAG file's and the deployment's), as the teardown checks them
        in_force = check_params(context, self.limits) if changes else None
        plan = apply_choice(
            cfg, proposal, choice, by=f"review ({who})", so=so, changes=changes, limits=in_force
        )
        answer = f"{who} chose {choice!r}" + (
            f"; changed for the next rounds: {sorted(changes)}" if changes else ""
        )
        if plan.mode != "skip":
            self._take_pool_back(cfg, plan, so, context, answer)  # defers while the pool re-warms
        elif self.worker_pool and as_replicas(self.replicas) is not None:
            record_answer(str(self.worker_pool), cfg, slot=self.slot, so=so)
        return self._run_answer(cfg, plan, so, context, answer)

    def _run_answer(
        self,
        cfg: RunConfig,
        plan: Plan,
        so: dict[str, Any],
        context: Context,
        answer: str,
        rewarmed: bool = False,
    ) -> list[dict[str, Any]]:
        if plan.mode != "skip":
            self._start(cfg, plan, context)  # workers that died during the review start again
            swapped = engine_swapped(cfg, plan, so) if rewarmed else None
            if swapped is not None:
                raise AirflowFailException(f"{self.slot}: {swapped}")
        mapped = self._commit(cfg, plan, so, context)
        self.log.info(
            "%s: %s: %s (%s)%s", self.slot, answer, plan.mode, plan.reason, self._lanes_note(plan, mapped)
        )
        return mapped

    def _open_gate(self, cfg: RunConfig, context: Context, so: dict[str, Any]) -> str | None:
        """The gate's policy applied to the run's pool (``gate_idle``); returns what it does to
        the GPUs, for the gate's text. Without ``replicas`` the gate keeps the lease, as it was."""
        replicas = as_replicas(self.replicas)
        if not self.worker_pool or replicas is None:
            return None
        wait = self.response_timeout.total_seconds() if self.response_timeout else None
        return open_gate(
            self.worker_pool, cfg, context, self.log, replicas=replicas, response_timeout_s=wait,
            slot=self.slot, so=so,
        ).text  # fmt: skip

    def _take_pool_back(
        self,
        cfg: RunConfig,
        plan: Plan,
        so: dict[str, Any],
        context: Context,
        answer: str,
        answered: bool = True,
    ) -> None:
        """The run's lease taken again and its pool woken or re-warmed for the round the answer
        (or, ``answered`` false, a round after an earlier gate) runs; a pool not ready yet is waited
        for on the triggerer (:meth:`execute_warm`), the plan stored first (``plan.json``: rewritten
        with the engines once the pool is ready), so nothing of the answer is lost if the triggerer
        restarts. Without ``replicas`` (the gates keep the lease) there is nothing to take back."""
        replicas, pool = as_replicas(self.replicas), str(self.worker_pool)
        if not self.worker_pool or replicas is None:
            return
        answered_at = time.time()  # before the lease is taken again: its workers' starts count from here
        if answer_gate(
            pool, cfg, context, self.log, replicas=replicas, slot=self.slot, so=so, answered=answered
        ):
            return
        write_plan(RunLayout(cfg.run_root), plan, so)
        self.log.info("%s: waiting on the triggerer for %d workers of %s", self.slot, replicas, pool)
        self.defer(
            trigger=warm_trigger(pool, replicas, lease_id(context), self.ready_timeout_s),
            method_name="execute_warm",
            kwargs={"answered_at": answered_at, "answer": answer},
        )

    def execute_warm(
        self, context: Context, event: dict[str, Any], answered_at: float, answer: str
    ) -> list[dict[str, Any]]:
        """After the pool the answer re-warmed is ready: the answer's round runs (its stored plan)."""
        so = storage_options_from_aws_conn(self.aws_conn_id)
        cfg = owned_run_config(self.run_root, context, so)
        replicas = as_replicas(self.replicas) or 1
        if event.get("state") != "ready":
            raise AirflowFailException(
                f"{self.slot}: {warm_failure(str(self.worker_pool), event, replicas, self.ready_timeout_s)}"
            )
        plan = read_plan(RunLayout(cfg.run_root), self.slot, so)
        if plan is None:
            raise AirflowFailException(f"{self.slot}: the answer's plan.json is gone. {REOPEN}")
        took = record_warm(
            str(self.worker_pool), cfg, replicas=replicas, requested_at=answered_at, slot=self.slot, so=so,
            log=self.log,
        )  # fmt: skip
        self.log.info("%s: worker pool %s ready %.1f s after the answer", self.slot, self.worker_pool, took)
        return self._run_answer(cfg, plan, so, context, answer, rewarmed=True)

    def _lanes_note(self, plan: Plan, mapped: list[dict[str, Any]]) -> str:
        if not mapped:
            return ""
        return f"; {len(plan.shards)} shards on {len(mapped)} lanes"


class CloseRoundOperator(BaseOperator, SkipMixin):
    """Quarantine, count check, recompaction and ``summary.json`` for one round slot.

    With ``later_slots`` and ``report`` (the factory DAG's), a close that finds the run finished
    folds the DAG's tail (:mod:`~airflow_batchinfer.run.fold`): when every later slot would skip
    without a review gate, it writes their plans and the report
    (:func:`~airflow_batchinfer.operators.report.write_report`) and skips the later slots' tasks and,
    when the report passes, the report task, whose results event it emits through its
    :class:`~airflow.sdk.AssetAlias` outlet (``results``). A run the report fails leaves the report
    task to fail with the reason, as without the fold. Teardowns are never skipped.

    :param later_slots: the DAG's round slots after this one (their task groups: :func:`slot_group`).
    :param report: the report task's id.
    :param results: the asset the report task's event is for, emitted here when the report task is
        skipped."""

    template_fields = ("run_root", "aws_conn_id")
    ui_color = "#e2f0d9"

    def __init__(
        self,
        *,
        slot: str,
        run_root: str,
        aws_conn_id: str | None = None,
        later_slots: Sequence[str] = (),
        report: str | None = None,
        results: Asset | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("trigger_rule", "all_done")
        super().__init__(**kwargs)
        self.slot = slot
        self.run_root = run_root
        self.aws_conn_id = aws_conn_id
        self.later_slots = tuple(later_slots)
        self.report = report
        self.results = results

    def execute(self, context: Context) -> dict[str, Any] | None:
        so = storage_options_from_aws_conn(self.aws_conn_id)
        cfg = owned_run_config(self.run_root, context, so)
        plan = read_plan(RunLayout(cfg.run_root), self.slot, so)
        if plan is None:
            raise AirflowFailException(f"{self.slot}: no plan.json; the round controller did not finish")
        result = self._close(cfg, plan, so)
        if self.report is not None:
            self._fold(cfg, so, context, result)
        return result

    def _close(self, cfg: RunConfig, plan: Plan, so: dict[str, Any]) -> dict[str, Any] | None:
        summary = close_round(cfg, plan, so)
        if summary is None:
            return None
        counts = {k: summary[k] for k in ("pending", "approved", "failed_records")}
        self.log.info("round %d closed: %s", plan.round, counts)
        for failed in summary["failed_shards"]:
            self.log.error(
                "quarantined shard %s (%s): %s", failed["shard_id"], failed["phase"], failed["error"]
            )
        if not summary["invariant"]["ok"]:
            raise AirflowFailException(
                f"round {plan.round}: {summary['invariant']['planned']} records planned but "
                f"{summary['invariant']['accounted']} accounted for. Remedy: inspect the job manifests in "
                f"{RunLayout(cfg.run_root).round(plan.round)}/jobs and re-run the round."
            )
        return {k: v for k, v in summary.items() if k not in ("failed_shards", "tokens")}

    def _fold(
        self, cfg: RunConfig, so: dict[str, Any], context: Context, result: dict[str, Any] | None
    ) -> None:
        """Fold the DAG's tail when the run is finished (see the class doc); returns when it is not."""
        layout = RunLayout(cfg.run_root)
        try:
            upcoming = next_slot(cfg, self.later_slots)
            snapshot = None if upcoming is None else load_snapshot(cfg, upcoming, so)
            fold = fold_tail(cfg, self.later_slots, snapshot)
            if fold is None:
                return
            for later in fold.plans:  # as each later plan task would write it (a skip writes no more)
                write_plan(layout, later, so)
                self.log.info("%s: skip (%s), written here", later.slot, later.reason)
            report = write_report(cfg, so, self.log)
        except (BatchInferError, OSError) as exc:  # the later tasks do it themselves, as without a fold
            self.log.warning("%s: the run's tail not folded (%s); its tasks run", self.slot, exc)
            return
        failed = report_failure(cfg, report)
        skipped = self._tail_tasks(report_too=failed is None)
        if failed is None and self.results is not None:
            alias = next((o for o in self.outlets if isinstance(o, AssetAlias)), None)
            if alias is not None:
                extra = results_event(report, cfg.data.output_format)
                context["outlet_events"][alias].add(self.results, extra=extra)
        self.log.info(
            "%s: the run is finished; %s skipped: %s",
            self.slot,
            "its later slots and the report (written here)" if failed is None else "its later slots",
            ", ".join(t.task_id for t in skipped),
        )
        if result is not None:  # skip() ends execute: the return value is pushed here
            context["ti"].xcom_push(key=RETURN_VALUE, value=result)
        self.skip(context["ti"], skipped)

    def _tail_tasks(self, *, report_too: bool) -> list[Any]:
        """The later slots' tasks and, with ``report_too``, the report task (never a teardown)."""
        groups = {slot_group(s) for s in self.later_slots}
        dag = self.dag  # the task's DAG (raises if it has none)
        tasks = [t for t in dag.tasks if t.task_id.split(".", 1)[0] in groups and not t.is_teardown]
        if report_too and self.report is not None:
            tasks.append(dag.get_task(self.report))
        return tasks


def slot_group(slot: str) -> str:
    """The task group of a round slot in the factory DAG: ``round-00`` → ``round_00``."""
    return slot.replace("-", "_")
