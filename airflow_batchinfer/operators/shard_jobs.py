"""Shard job operators: ``InferJudgeShardOperator`` (a round's one job per shard), ``InferShardOperator``
and ``JudgeShardOperator`` (the two passes of a judge with its own pool) and
``InPlaceRetryShardOperator``.

Mapped over shard descriptors (``.partial(pool=...).expand(shard=...)``). Each submits its shard's
job to the warm pool by reference, defers on :class:`WorkerJobTrigger` (no worker slot held while
the GPU works), and returns a small dict (the shard, its round and counts) for XCom.

- A job whose completion manifest already exists with the same fingerprint is not run again.
- A job id runs on at most one worker: a retry (after a zombie task, a timeout, a re-run) first asks
  the pool's workers whether one still runs the job and follows it there.
- A lost worker or job, or one a draining worker gave up, is resubmitted under the same job id
  (idempotent); the completion manifest decides. The decisions are the shared job tracker's
  (:mod:`airflow_batchinfer.rpc.tracking`), as in ``batchinfer run``.
- A task that times out or is killed cancels its remote job.
- Each task renews the run's lease on the pool (a local pool also restarts workers that died).
- A failing job fails the task, so Airflow's ``retries`` apply; its error is kept next to the
  shard's manifests, and the round's close quarantines the shard once retries are exhausted.
- ``execution_timeout`` holds while deferred: the trigger's deadline is the task's.
- A job that finishes within ``inline_wait_s`` of its submission (a rule judge, a small shard) is
  awaited in the task itself: deferring and resuming would cost more than the job.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any, ClassVar, cast

from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowException

from airflow_batchinfer.exceptions import BatchInferError, WorkerBusy, WorkerUnavailable
from airflow_batchinfer.hooks.aws import storage_options_from_aws_conn
from airflow_batchinfer.hooks.pool import open_pool
from airflow_batchinfer.operators.pool import hold_pool, lease_id
from airflow_batchinfer.pools import WorkerPool
from airflow_batchinfer.rpc.client import SyncWorkerClient
from airflow_batchinfer.rpc.fingerprint import pin_input
from airflow_batchinfer.rpc.locate import SUBMIT_TIMEOUT_S  # a try's wait for a worker slot
from airflow_batchinfer.rpc.models import JobKind, JobSpec
from airflow_batchinfer.rpc.pool import PoolClient, follow
from airflow_batchinfer.rpc.tracking import JobEvent, after_event
from airflow_batchinfer.run.jobs import inferred_shard, job_spec, judge_input, record_job_error, shard_config
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import JobManifest, read_job_manifest
from airflow_batchinfer.state.owner import owned_run_config
from airflow_batchinfer.state.tally import Tally
from airflow_batchinfer.storage import JsonlFile, ShardDescriptor
from airflow_batchinfer.triggers import SETTLE_S
from airflow_batchinfer.triggers.worker_job import WorkerJobTrigger


def task_deadline(context: Context, execution_timeout: timedelta | None) -> float | None:
    """When the task's try must end (wall clock): ``execution_timeout`` from the try's start. A trigger
    gets it, since Airflow's own timeout does not reach a deferred task's trigger."""
    if execution_timeout is None:
        return None
    start = context["ti"].start_date
    started = start.timestamp() if start else time.time()
    return started + execution_timeout.total_seconds()


def deferral_timeout(deadline: float | None) -> timedelta | None:
    """The deferral's own timeout: a minute past ``deadline``, a backstop for a trigger that never ends."""
    return None if deadline is None else timedelta(seconds=max(1.0, deadline - time.time() + 60))


class ShardJobOperator(BaseOperator):
    """Base of the shard job operators.

    :param shard: a shard descriptor ``{shard_id, uri, records, round}`` (from the round's plan).
    :param run_root: the run's root (templated).
    :param worker_pool: ``local://NAME`` or a ``batchinfer_pool`` connection id (templated).
    :param aws_conn_id: AWS connection for ``s3://`` run roots on the Airflow side.
    :param poll_interval_s: how often the trigger asks the worker.
    :param lost_grace_s: how long an unreachable worker is waited for before resubmitting.
    :param max_resubmits: resubmissions after lost workers within one try.
    :param inline_wait_s: how long to wait in the task before deferring (0: defer at once).
    """

    kind: ClassVar[JobKind]
    template_fields = ("shard", "run_root", "worker_pool", "aws_conn_id")
    ui_color = "#e8f4fd"

    def __init__(
        self,
        *,
        shard: dict[str, Any],
        run_root: str,
        worker_pool: str,
        aws_conn_id: str | None = None,
        poll_interval_s: float = 2.0,
        lost_grace_s: float = 30.0,
        max_resubmits: int = 5,
        inline_wait_s: float = 5.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.shard = shard
        self.run_root = run_root
        self.worker_pool = worker_pool
        self.aws_conn_id = aws_conn_id
        self.poll_interval_s = poll_interval_s
        self.lost_grace_s = lost_grace_s
        self.max_resubmits = max_resubmits
        self.inline_wait_s = inline_wait_s
        self._remote: tuple[str, str] | None = None  # (worker URL, job id) of the job in flight
        self._pool: WorkerPool | None = None  # opened once per execution

    # ------------------------------------------------------------------------------- helpers
    @property
    def storage_options(self) -> dict[str, Any]:
        return storage_options_from_aws_conn(self.aws_conn_id)

    def _config(self, context: Context) -> RunConfig:
        """The run's settings as this shard's round runs them: its plan's (a review may have changed
        them), read once the run root's owner is checked."""
        cfg = owned_run_config(self.run_root, context, self.storage_options)
        return shard_config(cfg, cast(ShardDescriptor, self.shard), self.storage_options)

    def _spec(self, cfg: RunConfig) -> JobSpec:
        """The shard's job, pinned to the current version of its input (see ``pin_input``)."""
        spec = job_spec(cfg, self.kind, int(self.shard["round"]), cast(ShardDescriptor, self.shard))
        return pin_input(spec, JsonlFile(spec.input, storage_options=self.storage_options).info())

    def _client(self, pool: WorkerPool, context: Context, cfg: RunConfig | None = None) -> PoolClient:
        grace = {} if cfg is None else {"unreachable_grace_s": cfg.unreachable_grace_s}
        return PoolClient.for_pool(
            pool,
            lease_id=lease_id(context),
            storage_options=self.storage_options,
            poll_interval_s=self.poll_interval_s,
            lost_grace_s=self.lost_grace_s,
            **grace,
        )

    def _submit_deadline(self, deadline: float | None) -> float:
        """When submitting gives up (monotonic): :data:`SUBMIT_TIMEOUT_S` from now, or the task's own
        ``deadline`` (wall clock) if sooner: a wait for a silent worker never outlasts the task."""
        until = time.monotonic() + SUBMIT_TIMEOUT_S
        return until if deadline is None else min(until, time.monotonic() + deadline - time.time())

    def _what(self) -> str:
        return f"shard {self.shard['shard_id']} ({self.kind}, round {self.shard['round']})"

    def _result(self, cfg: RunConfig, counts: Tally) -> dict[str, Any]:
        """The task's return value (XCom): the shard, its round and its job's counts."""
        return {
            "shard_id": self.shard["shard_id"],
            "round": self.shard["round"],
            "records": self.shard["records"],
            "counts": counts.model_dump(mode="json"),
        }

    def _deadline(self, context: Context) -> float | None:
        return task_deadline(context, self.execution_timeout)

    # ------------------------------------------------------------------------------- execute
    def execute(self, context: Context) -> dict[str, Any] | None:
        cfg = self._config(context)
        spec = self._spec(cfg)
        pool = self._pool = hold_pool(self.worker_pool, context, self.log)

        async def check() -> JobManifest | None:
            client = self._client(pool, context)
            try:
                return await client.finished(spec)
            finally:
                await client.aclose()

        done = asyncio.run(check())
        if done is not None:
            self.log.info("%s: finished earlier with the same fingerprint; not run again", self._what())
            return self._result(cfg, done.counts)
        # A first try cannot have a copy running anywhere; a later one (zombie, timeout, clear) may.
        return self._submit(context, cfg, spec, pool, resubmits=0, locate=context["ti"].try_number > 1)

    def _submit(
        self,
        context: Context,
        cfg: RunConfig,
        spec: JobSpec,
        pool: WorkerPool,
        resubmits: int,
        *,
        locate: bool = True,
    ) -> dict[str, Any] | None:
        deadline = self._deadline(context)

        async def submit() -> tuple[str, JobEvent | None]:
            client = self._client(pool, context, cfg)
            try:  # a copy a silent worker may run is waited for (unreachable_grace_s), never doubled
                url, status = await client.submit_when_free(
                    spec, deadline=self._submit_deadline(deadline), locate=locate
                )
                self._remote = (url, spec.job_id)  # what on_kill cancels
                # Short jobs finish here: deferring and resuming would cost more than the job.
                event = await follow(
                    client.worker(url),
                    spec.job_id,
                    first=status,
                    poll_interval_s=min(0.5, self.poll_interval_s),
                    lost_grace_s=self.lost_grace_s,
                    until=time.monotonic() + self.inline_wait_s,
                    deadline=deadline,
                )
                return url, event
            finally:
                await client.aclose()

        try:
            url, event = asyncio.run(submit())
        except (WorkerBusy, WorkerUnavailable) as exc:
            raise AirflowException(
                f"{self._what()}: no worker of pool {self.worker_pool!r} took the job within "
                f"{SUBMIT_TIMEOUT_S:.0f} s ({exc}). Remedy: check the pool (`batchinfer pool status`) and "
                "that the Airflow pool's slots do not exceed replicas x concurrency; Airflow retries the "
                "task."
            ) from exc
        self.log.info("%s: job %s on %s (%d records)", self._what(), spec.job_id, url, self.shard["records"])
        if event is not None:
            return self.execute_complete(context, event.to_dict(), url=url, resubmits=resubmits)
        timeout = deferral_timeout(deadline)
        self.defer(
            trigger=WorkerJobTrigger(
                worker_pool=self.worker_pool,
                url=url,
                job_id=spec.job_id,
                deadline=deadline,
                poll_interval_s=self.poll_interval_s,
                lost_grace_s=self.lost_grace_s,
                not_before=time.time() + SETTLE_S,
                # a job whose manifest says it succeeded ends the task on the triggerer (a run root read
                # with an aws_conn_id: the task resumes and reads it; the triggerer looks up no connection)
                result=self._result(cfg, Tally()),
                manifest=spec.outputs["manifest"],
                aws_conn_id=self.aws_conn_id,
            ),
            method_name="execute_complete",
            kwargs={"url": url, "resubmits": resubmits},
            timeout=timeout,
        )
        return None  # not reached: defer() raises

    def execute_complete(
        self, context: Context, event: dict[str, Any], url: str = "", resubmits: int = 0
    ) -> dict[str, Any] | None:
        cfg = self._config(context)
        spec = self._spec(cfg)
        ev = JobEvent.from_dict(event, job_id=spec.job_id, url=url)
        self._remote = (ev.url, ev.job_id)
        manifest = None
        if ev.state in ("succeeded", "lost"):
            manifest = read_job_manifest(spec.outputs["manifest"], self.storage_options)
        outcome = after_event(ev, manifest=manifest, resubmits=resubmits, max_resubmits=self.max_resubmits)
        if outcome == "done":
            assert manifest is not None
            self.log.info("%s: done on %s: %s", self._what(), ev.url, manifest.counts)
            return self._result(cfg, manifest.counts)
        if outcome == "resubmit":
            self.log.warning("%s: %s; resubmitting", self._what(), ev.error)
            self._pool = hold_pool(self.worker_pool, context, self.log)
            return self._submit(context, cfg, spec, self._pool, resubmits + 1)
        if ev.state == "timeout":
            self._cancel_remote()
            self._fail(
                cfg, f"did not finish within execution_timeout ({self.execution_timeout}); job cancelled"
            )
        if ev.state in ("lost", "succeeded"):
            self._fail(
                cfg, f"lost or without a manifest {resubmits + 1} times (last: {ev.error or ev.state})"
            )
        self._fail(cfg, f"{ev.state} on {ev.url}: {ev.error}")
        return None

    def on_kill(self) -> None:
        """The task is being killed (timeout, marked failed, cleared): its job must not run on."""
        self._cancel_remote()

    def _cancel_remote(self) -> None:
        remote = self._remote
        if remote is None:
            return
        url, job_id = remote
        try:
            # Synchronous: on_kill may run in a signal handler while the task's event loop runs.
            token = (self._pool or open_pool(self.worker_pool)).token()
            with SyncWorkerClient(url, token=token, timeout=10) as client:
                client.cancel(job_id)
            self.log.info("%s: cancelled job %s on %s", self._what(), job_id, url)
        except Exception as exc:  # best effort: a retry finds and follows the job anyway
            self.log.warning("%s: could not cancel job %s on %s: %s", self._what(), job_id, url, exc)

    def _fail(self, cfg: RunConfig, error: str) -> None:
        try:
            record_job_error(
                cfg, int(self.shard["round"]), self.shard["shard_id"], self.kind, error, self.storage_options
            )
        except (OSError, BatchInferError) as exc:  # a full or unreachable store must not hide the error
            self.log.error("%s: could not record the job error next to its manifest: %s", self._what(), exc)
        raise AirflowException(
            f"{self._what()} {error}. Remedy: see the worker log for the record that failed; Airflow retries "
            "the task, and after the last retry the round's close quarantines the shard into failed/."
        )


class InferShardOperator(ShardJobOperator):
    """Generate for every record of the shard; returns the judge's input descriptor."""

    kind = "infer"

    def _result(self, cfg: RunConfig, counts: Tally) -> dict[str, Any]:
        r = int(self.shard["round"])
        shard = cast(ShardDescriptor, self.shard)
        slot = {"slot": shard["slot"]} if "slot" in shard else {}
        return {**inferred_shard(cfg, r, shard), "round": r, **slot, "counts": counts.model_dump(mode="json")}


class JudgeShardOperator(ShardJobOperator):
    """Judge an inferred shard into approved (results) and rejected (next round's candidates)."""

    kind = "judge"

    def _spec(self, cfg: RunConfig) -> JobSpec:
        """The judge of the infer attempt the infer manifest names now (see ``judge_input``): a late
        infer copy writes an attempt of its own, so what this job reads never changes under it."""
        r, shard = int(self.shard["round"]), cast(ShardDescriptor, self.shard)
        spec = job_spec(cfg, self.kind, r, judge_input(cfg, r, shard, self.storage_options))
        return pin_input(spec, JsonlFile(spec.input, storage_options=self.storage_options).info())


class InferJudgeShardOperator(ShardJobOperator):
    """Infer and judge the shard in one job on the run's pool: the shard is read once, and its
    approved and rejected rows are written directly (a rule judge, or an LLM judge served by the
    same pool)."""

    kind = "infer_judge"


class InPlaceRetryShardOperator(ShardJobOperator):
    """Retry each sample of the shard inside the worker until approved or ``max_attempts``."""

    kind = "in_place"
