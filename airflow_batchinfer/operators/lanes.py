"""``ShardLaneOperator``: one lane of a round (:mod:`airflow_batchinfer.run.lanes`), mapped
``.partial(...).expand(lane=plan.output)`` over the lane descriptors the round's plan task returns.

A round maps one task per lane, not per shard: each lane runs one shard's jobs at a time and takes
the next unclaimed shard until none is left, so a round may hold far more shards than
``[core] max_map_length`` and its tail is about one small shard. The grid shows one box per lane; each
shard's state is in the lane's log, its document (``round-NN/lanes/``), the report and the desk.

Where the lane runs:

- **on the triggerer** (the default): the task checks the run root's owner, reads the lane's plan,
  renews the run's lease on the pool (restarting dead local workers) and defers at once to
  :class:`~airflow_batchinfer.triggers.lane.LaneTrigger`, which runs the lane and ends the task there
  with the lane's result: no worker slot is held while the GPUs work. The triggerer reads the run
  root with plain fsspec: local disk, or S3 with the environment's credentials (IRSA, instance roles,
  ``AWS_*`` variables);
- **in the task**, with an ``aws_conn_id`` (the triggerer makes no Airflow connection lookup for the
  credentials: apache/airflow#64620) or ``in_task=True``: the lane runs
  in the task process (``asyncio.run``), holding one Airflow worker slot for the lane's duration.
  Size the executor for ``lanes`` more running tasks.

Either way the lane runs :func:`~airflow_batchinfer.run.lane_driver.drive_lane`. With a judge on its
own pool (``judge_pool``, a DAG built with ``judge_airflow_pool``) the round maps judge lanes too, in
that Airflow pool (:mod:`~airflow_batchinfer.run.judge_lanes`): each judges the shards the inference
lanes have finished, as soon as each ends; an inference lane renews the judge pool's lease too, since
it judges the shards left when every judge lane has ended.
A shard's failing job is retried ``job_retries`` times, then its error is kept next to its
manifests and the lane moves on (the round's close quarantines the shard); an error that stops the
lane itself (no worker takes a job, storage unreachable) fails the task naming the lane and the shard,
and Airflow's ``retries`` apply: the retry takes the lane's unfinished shard back first.
``job_timeout`` bounds each shard job; ``execution_timeout``, if set, bounds a lane's try (all its
shards), on the triggerer too. A killed or timed-out lane cancels the job it was running.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any, cast

from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowException

from airflow_batchinfer.compat import AirflowFailException
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.hooks.aws import storage_options_from_aws_conn
from airflow_batchinfer.hooks.pool import open_pool
from airflow_batchinfer.operators.pool import hold_pool, lease_id
from airflow_batchinfer.operators.shard import max_map_length
from airflow_batchinfer.pools import WorkerPool
from airflow_batchinfer.rpc.client import SyncWorkerClient
from airflow_batchinfer.run.lane_driver import (
    LaneEvent,
    Logger,
    TrackedPoolClient,
    drive_lane,
    lane_event,
    lane_failure_message,
    lane_round,
    lane_shard,
)
from airflow_batchinfer.run.lanes import Lane, LaneResult, judge_lanes_of, lane_result
from airflow_batchinfer.state.docs import read_plan
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.state.owner import owned_run_config, task_owns
from airflow_batchinfer.triggers import SETTLE_S
from airflow_batchinfer.triggers.lane import LaneTrigger


def task_deadline(context: Context, execution_timeout: timedelta | None) -> float | None:
    """When the task's try must end (wall clock): ``execution_timeout`` from the try's start. The
    trigger gets it, since Airflow's own timeout does not reach a deferred task's trigger."""
    if execution_timeout is None:
        return None
    start = context["ti"].start_date
    started = start.timestamp() if start else time.time()
    return started + execution_timeout.total_seconds()


def deferral_timeout(deadline: float | None) -> timedelta | None:
    """The deferral's own timeout: a minute past ``deadline``, a backstop for a trigger that never ends."""
    return None if deadline is None else timedelta(seconds=max(1.0, deadline - time.time() + 60))


class ShardLaneOperator(BaseOperator):
    """Run one lane of a round until no shard is left.

    :param lane: a lane descriptor ``{slot, round, lane, lanes}`` (from the round's plan task); a
        judge lane's has ``role: judge`` (:mod:`~airflow_batchinfer.run.judge_lanes`).
    :param run_root: the run's root (templated).
    :param worker_pool: ``local://NAME`` or a ``batchinfer_pool`` connection id (templated): the run's
        pool, or a judge lane's judge pool.
    :param aws_conn_id: AWS connection for ``s3://`` run roots on the Airflow side; with one, the
        lane runs in the task (the triggerer cannot look the connection up).
    :param in_task: run the lane in the task even without ``aws_conn_id`` (a triggerer that cannot
        reach the run root's storage).
    :param poll_interval_s: how often a job's worker is asked (a long poll: a job's end is seen at once).
    :param lost_grace_s: how long an unreachable worker is waited for before resubmitting its job.
    :param max_resubmits: resubmissions of one job after lost workers.
    :param job_timeout: each shard job's bound: past it the job is cancelled and counts as failed
        (retried ``job_retries`` times, then its shard is quarantined; the lane goes on). The
        factory gives lanes its ``execution_timeout`` here, and none to the lane task itself, whose
        lane lasts as long as its round.
    """

    template_fields = ("lane", "run_root", "worker_pool", "aws_conn_id")
    ui_color = "#d9ecf9"

    def __init__(
        self,
        *,
        lane: dict[str, Any],
        run_root: str,
        worker_pool: str,
        aws_conn_id: str | None = None,
        in_task: bool = False,
        poll_interval_s: float = 2.0,
        lost_grace_s: float = 30.0,
        max_resubmits: int = 5,
        job_timeout: timedelta | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.lane = lane
        self.run_root = run_root
        self.worker_pool = worker_pool
        self.aws_conn_id = aws_conn_id
        self.in_task = in_task
        self.poll_interval_s = poll_interval_s
        self.lost_grace_s = lost_grace_s
        self.max_resubmits = max_resubmits
        self.job_timeout = job_timeout
        self._clients: list[TrackedPoolClient] = []  # in the task: the clients whose jobs on_kill cancels

    @property
    def storage_options(self) -> dict[str, Any]:
        return storage_options_from_aws_conn(self.aws_conn_id)

    def _client_args(self, context: Context) -> dict[str, Any]:
        return {
            "lease_id": lease_id(context),
            "poll_interval_s": self.poll_interval_s,
            "lost_grace_s": self.lost_grace_s,
            "max_resubmits": self.max_resubmits,
            "job_timeout_s": None if self.job_timeout is None else self.job_timeout.total_seconds(),
        }

    # ------------------------------------------------------------------------------- execute
    def execute(self, context: Context) -> LaneResult | None:
        lane = Lane.of(self.lane)
        so = self.storage_options
        task_owns(self.run_root, context, so)
        try:
            cfg, plan = lane_round(self.run_root, lane, so)
        except ConfigError as exc:  # no plan: a retry would not make one
            raise AirflowFailException(str(exc)) from exc
        pool = hold_pool(self.worker_pool, context, self.log)
        if cfg.judging.judge_pool and not lane.judge:  # it judges what the judge lanes leave: kept too
            hold_pool(cfg.judging.judge_pool, context, self.log)
        here = bool(self.aws_conn_id) or self.in_task
        self.log.info(
            "%slane %d of %d of %s: %d shards in the round (%d records, %s); running %s",
            "judge " if lane.judge else "",
            lane.index,
            lane.count,
            lane.slot,
            len(plan.shards),
            plan.records,
            plan.mode,
            "in this task" if here else "on the triggerer",
        )
        if here:
            return self._run_here(context, lane, pool)
        deadline = task_deadline(context, self.execution_timeout)
        self.defer(
            trigger=LaneTrigger(
                lane=lane.as_dict(),
                run_root=self.run_root,
                worker_pool=self.worker_pool,
                **self._client_args(context),
                deadline=deadline,
                not_before=time.time() + SETTLE_S,
            ),
            method_name="execute_complete",
            timeout=deferral_timeout(deadline),
        )
        return None  # not reached: defer() raises

    def _run_here(self, context: Context, lane: Lane, pool: WorkerPool) -> LaneResult:
        """The lane in this task process: the same loop as the trigger's, reading with the connection's
        credentials. Airflow's ``execution_timeout`` holds here as for any task (then on_kill)."""
        so = self.storage_options
        args = {**self._client_args(context), "storage_options": so}

        async def opener(ref: str) -> WorkerPool:
            return open_pool(ref)  # a judge's own pool; a connection lookup is fine in a task

        self._clients = []
        go = drive_lane(
            lane,
            self.run_root,
            pool,
            so=so,
            logger=cast(Logger, self.log),  # stdlib-style: %-args
            open_pool=opener,
            client_args=args,
            tracked=self._clients,
        )
        try:
            doc = asyncio.run(go)
        except AirflowException:  # Airflow's own (a timeout: on_kill follows)
            raise
        except Exception as exc:
            raise AirflowException(
                lane_failure_message(lane_event(lane, lane_shard(self.run_root, lane, so), exc))
            ) from exc
        return lane_result(doc)

    def execute_complete(self, context: Context, event: LaneEvent) -> LaneResult:
        """A lane the trigger could not finish (a finished one ended its task on the triggerer)."""
        raise AirflowException(lane_failure_message(event))

    # ------------------------------------------------------------------------------- on_kill
    def on_kill(self) -> None:
        """The task is being killed (timeout, marked, cleared) while its lane runs here: the job the
        lane runs must not run on. (A deferred lane's trigger cancels its own: LaneTrigger.on_kill.)"""
        for client in self._clients:
            if client.current is None:
                continue
            url, job_id = client.current
            try:  # synchronous: on_kill may run in a signal handler while the lane's event loop runs
                with SyncWorkerClient(url, token=client.token, timeout=10) as worker:
                    worker.cancel(job_id)
                self.log.info("lane %s: cancelled job %s on %s", self.lane, job_id, url)
            except Exception as exc:  # best effort: the retry finds and follows the job anyway
                self.log.warning("lane %s: could not cancel job %s on %s: %s", self.lane, job_id, url, exc)


class JudgeLanesOperator(BaseOperator):
    """A round slot's judge lanes (:mod:`~airflow_batchinfer.run.judge_lanes`), for a DAG whose judge
    has its own pool: it reads the slot's plan once its plan task stored it and returns the judge lane
    descriptors its judge lane task is expanded over, one per slot of the judge pool (Airflow maps
    over a task's return value only, and the plan task's are the lanes'); ``[]``: none.

    :param slot: the round slot.
    :param run_root: the run's root (templated).
    :param judge_slots: the judge pool's job slots, ``judge_replicas × judge_concurrency`` (templated).
    :param aws_conn_id: AWS connection for ``s3://`` run roots on the Airflow side.
    """

    template_fields = ("run_root", "aws_conn_id", "judge_slots")
    ui_color = "#e8f4e0"

    def __init__(
        self,
        *,
        slot: str,
        run_root: str,
        judge_slots: int | str,
        aws_conn_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.slot = slot
        self.run_root = run_root
        self.judge_slots = judge_slots
        self.aws_conn_id = aws_conn_id

    def execute(self, context: Context) -> list[dict[str, Any]]:
        so = storage_options_from_aws_conn(self.aws_conn_id)
        cfg = owned_run_config(self.run_root, context, so)
        plan = read_plan(RunLayout(cfg.run_root), self.slot, so)
        if plan is None:
            raise AirflowFailException(
                f"{self.slot}: no plan.json under {cfg.run_root}. Remedy: clear the slot's plan task"
            )
        try:
            slots = int(str(self.judge_slots))
            lanes = judge_lanes_of(plan.effective_config(cfg), plan, slots, max_map_length())
        except (ConfigError, ValueError) as exc:
            raise AirflowFailException(
                f"{self.slot}: judge lanes: {exc}. Remedy: set judge_replicas and judge_concurrency to "
                "positive numbers"
            ) from exc
        self.log.info(
            "%s: %d judge lanes for %d shards (%s)", self.slot, len(lanes), len(plan.shards), plan.mode
        )
        return lanes
