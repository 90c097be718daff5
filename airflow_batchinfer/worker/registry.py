"""Jobs of one worker: slots, idempotent submission, lifecycle, and completion manifests."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from airflow_batchinfer.batching import BatchStats
from airflow_batchinfer.exceptions import BatchInferError, JobConflict, WorkerBusy
from airflow_batchinfer.rpc.fingerprint import fingerprint, spec_input_info
from airflow_batchinfer.rpc.models import TERMINAL_STATES, JobSpec, JobState, JobStatus
from airflow_batchinfer.state.docs import BatcherDelta, JobManifest, Timings, write_job_manifest
from airflow_batchinfer.state.params import JobSetup
from airflow_batchinfer.state.tally import Tally
from airflow_batchinfer.storage.confine import confined
from airflow_batchinfer.worker.jobs.context import JobContext
from airflow_batchinfer.worker.jobs.in_place import run_in_place
from airflow_batchinfer.worker.jobs.infer import run_infer, run_infer_judge
from airflow_batchinfer.worker.jobs.judge import run_judge
from airflow_batchinfer.worker.runtime import Runtime
from airflow_batchinfer.worker.security import PrefixPolicy
from airflow_batchinfer.worker.telemetry import Telemetry

log = logging.getLogger("airflow_batchinfer.worker")
KEEP_FINISHED = 10_000  # finished jobs remembered for status queries
DRAINED = "cancelled: the worker is draining (shutting down); resubmit elsewhere"

# The job each kind runs: it returns what it counted (its manifest's ``counts``).
SHARD_JOBS: dict[str, Callable[[JobContext], Awaitable[Tally]]] = {
    "infer": run_infer,
    "judge": run_judge,
    "infer_judge": run_infer_judge,
    "in_place": run_in_place,
}


@dataclass
class Job:
    ctx: JobContext
    state: JobState = "running"
    error: str | None = None
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    task: asyncio.Task[None] | None = None
    # Given up by the worker itself (draining), not failed: a client resubmits it elsewhere.
    retryable: bool = False
    drained: bool = False  # cancelled by drain (set before the cancel reaches the job)

    def status(self, worker: str) -> JobStatus:
        spec = self.ctx.spec
        return JobStatus(
            job_id=spec.job_id,
            kind=spec.kind,
            state=self.state,
            counts=self.ctx.counts(),
            progress=self.ctx.progress,
            error=self.error,
            retryable=self.retryable,
            manifest=spec.outputs.get("manifest"),
            worker=worker,
            started_at=self.started_at,
            finished_at=self.finished_at,
        )


class JobRegistry:
    """``policy``: the worker's storage allow-list, checked at submit by the app and held while each
    job runs (:func:`~airflow_batchinfer.storage.confine.confined`): every local file a job opens
    is checked again then, so a directory swapped for a symlink mid-job fails the job, not leaks it."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        concurrency: int,
        worker_name: str | None = None,
        policy: PrefixPolicy | None = None,
    ) -> None:
        self.runtime = runtime
        self.concurrency = concurrency
        self.worker_name = worker_name or socket.gethostname()
        self.policy = policy if policy is not None and policy.confines else None
        self.jobs: dict[str, Job] = {}
        self.draining = False
        self.last_activity = time.monotonic()
        self.totals: Counter[str] = Counter()  # finished jobs by "kind:state", for /metrics
        self.records: Counter[str] = Counter()  # records of finished jobs by outcome, for /metrics
        self.tokens: Counter[str] = Counter()  # tokens of finished jobs, for /metrics
        self.telemetry = Telemetry(runtime.engine)  # the engine's own figures, for /metrics and manifests
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def busy(self) -> int:
        return sum(1 for j in self.jobs.values() if j.state == "running")

    def submit(self, spec: JobSpec, params: JobSetup) -> tuple[JobStatus, bool]:
        """Start ``spec`` or return the existing job with that id. ``True`` when newly started.

        A job id that is running or succeeded is never run twice; a failed or cancelled one may be
        submitted again (a retry), and so may a succeeded one the app has :meth:`forget`-ten.
        """
        existing = self.jobs.get(spec.job_id)
        if existing is not None and existing.state not in ("failed", "cancelled"):
            if existing.ctx.spec != spec:
                raise JobConflict(
                    f"job {spec.job_id} is already {existing.state} here with a different input, outputs or "
                    "params: a job id must name one job (include the run in it)"
                )
            return existing.status(self.worker_name), False
        if self.draining:
            raise WorkerBusy("worker is draining (shutting down): submit to another worker")
        if self.busy >= self.concurrency:
            raise WorkerBusy(f"all {self.concurrency} slots are busy: retry later or on another worker")
        job = Job(JobContext(spec, params, self.runtime))
        self.jobs[spec.job_id] = job
        self._idle.clear()
        self.last_activity = time.monotonic()
        job.task = asyncio.create_task(self._run(job), name=f"job:{spec.job_id}")
        self._forget_old()
        return job.status(self.worker_name), True

    async def _run(self, job: Job) -> None:
        # This task's context (and every task and thread the job starts) holds the allow-list.
        with confined(self.policy):
            await self._run_confined(job)

    async def _run_confined(self, job: Job) -> None:
        ctx = job.ctx
        spec = ctx.spec
        batch_before = self.runtime.batcher.stats
        window = self.telemetry.open()
        t0 = time.monotonic()
        try:
            counts = await SHARD_JOBS[spec.kind](ctx)
            info = await asyncio.to_thread(spec_input_info, spec, self.runtime.storage_options)
            manifest = JobManifest(
                job_id=spec.job_id,
                kind=spec.kind,
                state="succeeded",
                input=spec.input,
                outputs=spec.outputs,
                attempt=ctx.attempt,
                counts=counts,
                ids=ctx.ids_doc(),  # per output file (and input): count and digest of the ids
                tokens=dict(ctx.tokens),
                round=ctx.params.round,
                # what the outputs were generated with (a review may change it between rounds)
                sampling=spec.params.get("sampling"),
                fingerprint=fingerprint(spec, self.runtime.describe(), info),
                engine=self.runtime.describe(),
                worker=self.worker_name,
                timings=Timings(
                    started_at=job.started_at,
                    finished_at=time.time(),
                    run_s=round(time.monotonic() - t0, 3),
                ),
                batcher=_delta(batch_before, self.runtime.batcher.stats),
                engine_stats=self.telemetry.close(window),  # the engine's figures during the job
                # the rejected rows' reason groups (the review page reads them)
                reason_groups=None if spec.kind == "infer" else ctx.reason_groups.as_dict(),
                # fenced outputs: where this attempt wrote them (close moves them)
                committed=dict(ctx.committed) or None,
            )
            await asyncio.to_thread(
                write_job_manifest, spec.outputs["manifest"], manifest, self.runtime.storage_options
            )
            for cleanup in ctx.cleanup:  # the manifest completes the job: tidying cannot fail it
                try:
                    await asyncio.to_thread(cleanup)
                except Exception as exc:
                    log.warning("job %s is complete, but tidying after it failed: %s", spec.job_id, exc)
            job.state = "succeeded"
        except asyncio.CancelledError:
            if job.drained:
                job.state, job.error, job.retryable = "cancelled", DRAINED, True
            else:
                job.state, job.error = "cancelled", "cancelled"
        except BatchInferError as exc:
            job.state, job.error = "failed", f"{type(exc).__name__}: {exc}"
        except Exception as exc:
            log.exception("job %s failed", spec.job_id)
            cause = _sole_cause(exc)
            job.state, job.error = "failed", f"{type(cause).__name__}: {cause}"
        finally:
            self.telemetry.discard(window)  # a job that did not get to its manifest
            job.finished_at = time.time()
            self.last_activity = time.monotonic()
            self.totals[f"{spec.kind}:{job.state}"] += 1
            self.records.update(ctx.counts().by_outcome())
            self.tokens.update(ctx.tokens)
            if job.state != "succeeded":
                log.warning(
                    "job %s (%s, input %s) %s: %s", spec.job_id, spec.kind, spec.input, job.state, job.error
                )
            if self.busy == 0:
                self._idle.set()

    def forget(self, job_id: str) -> None:
        """Drop a finished job, so the same id runs again when submitted (its manifest is gone)."""
        job = self.jobs.get(job_id)
        if job is not None and job.state in TERMINAL_STATES:
            del self.jobs[job_id]

    def status(self, job_id: str) -> JobStatus | None:
        job = self.jobs.get(job_id)
        return None if job is None else job.status(self.worker_name)

    async def wait(self, job_id: str, timeout_s: float) -> JobStatus | None:
        """The job's status once it has ended, or after ``timeout_s`` if it runs on (``None``: no such
        job). The job itself is never cancelled by this (a caller that goes away only stops waiting)."""
        job = self.jobs.get(job_id)
        if job is not None and job.task is not None and not job.task.done() and timeout_s > 0:
            await asyncio.wait({job.task}, timeout=timeout_s)
        return self.status(job_id)

    def cancel(self, job_id: str) -> JobStatus | None:
        job = self.jobs.get(job_id)
        if job is None:
            return None
        if job.task is not None and job.state == "running":
            job.task.cancel()
        return job.status(self.worker_name)

    async def drain(self, timeout: float) -> None:
        """Stop accepting jobs; let running ones finish for ``timeout`` s, then cancel them
        (in-place jobs flush their checkpoints when cancelled). A job cancelled here ends
        ``cancelled`` with ``retryable`` set: it did not fail, it is to be resubmitted elsewhere."""
        self.draining = True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            running = [(j, j.task) for j in self.jobs.values() if j.state == "running" and j.task is not None]
            for job, task in running:
                job.drained = True  # the job did not fail: the worker is going away
                task.cancel()
            await asyncio.gather(*(task for _, task in running), return_exceptions=True)

    def state_counts(self) -> dict[str, int]:
        return dict(Counter(j.state for j in self.jobs.values()))

    def _forget_old(self) -> None:
        if len(self.jobs) <= KEEP_FINISHED:
            return
        finished = sorted(
            (j for j in self.jobs.values() if j.state in TERMINAL_STATES), key=lambda j: j.finished_at or 0
        )
        for job in finished[: len(self.jobs) - KEEP_FINISHED]:
            del self.jobs[job.ctx.spec.job_id]


def _sole_cause(exc: BaseException) -> BaseException:
    """The one error inside a job's task group (its message names the path and the remedy), rather
    than "unhandled errors in a TaskGroup"; a group of several stays as it is."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _delta(before: BatchStats, after: BatchStats) -> BatcherDelta:
    """Batcher activity during one job (shared with concurrent jobs)."""
    batches = after.total_batches - before.total_batches
    cost = after.total_batch_cost - before.total_batch_cost
    busy = after.busy_time_s - before.busy_time_s
    idle = after.idle_time_s - before.idle_time_s
    return BatcherDelta(
        batches=batches,
        avg_batch_cost=cost / batches if batches else 0.0,
        avg_fill=(cost / batches / after.target_batch_cost) if batches and after.target_batch_cost else 0.0,
        busy_s=round(busy, 4),
        idle_s=round(idle, 4),
        utilization=busy / (busy + idle) if busy + idle else 0.0,
    )
