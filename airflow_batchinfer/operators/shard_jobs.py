"""Shard job operators: ``InferShardOperator``, ``JudgeShardOperator``, ``InPlaceRetryShardOperator``.

Mapped over shard descriptors (``.partial(pool=...).expand(shard=...)``). Each submits its shard's
job to the warm pool by reference, defers on :class:`WorkerJobTrigger` (no worker slot held while
the GPU works), and returns a small dict (the shard, its round and counts) for XCom.

- A job whose completion manifest already exists with the same fingerprint is not run again.
- A lost worker or job is resubmitted under the same job id (idempotent); the manifest decides.
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

from airflow_batchinfer.exceptions import RpcError, WorkerBusy, WorkerUnavailable
from airflow_batchinfer.hooks.aws import storage_options_from_aws_conn
from airflow_batchinfer.hooks.pool import PoolEndpoints, pool_endpoints
from airflow_batchinfer.operators.pool import renew_lease
from airflow_batchinfer.rounds import inferred_shard, job_spec, read_run_config, record_job_error
from airflow_batchinfer.rpc.fingerprint import pin_input
from airflow_batchinfer.rpc.models import TERMINAL_STATES, JobKind, JobSpec
from airflow_batchinfer.rpc.pool import PoolClient
from airflow_batchinfer.run_config import RunConfig
from airflow_batchinfer.storage import JsonlFile, ShardDescriptor
from airflow_batchinfer.triggers.worker_job import WorkerJobTrigger
from airflow_batchinfer.worker.manifest import read_job_manifest

SUBMIT_TIMEOUT_S = 600.0  # how long to wait for a free worker slot before failing the try


class ShardJobOperator(BaseOperator):
    """Base of the three shard job operators.

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

    # ------------------------------------------------------------------------------- helpers
    @property
    def storage_options(self) -> dict[str, Any]:
        return storage_options_from_aws_conn(self.aws_conn_id)

    def _config(self) -> RunConfig:
        return read_run_config(self.run_root, self.storage_options)

    def _spec(self, cfg: RunConfig) -> JobSpec:
        """The shard's job, pinned to the current version of its input (see ``pin_input``)."""
        spec = job_spec(cfg, self.kind, int(self.shard["round"]), cast(ShardDescriptor, self.shard))
        return pin_input(spec, JsonlFile(spec.input, storage_options=self.storage_options).info())

    def _client(self, ep: PoolEndpoints) -> PoolClient:
        return ep.client(storage_options=self.storage_options)

    def _what(self) -> str:
        return f"shard {self.shard['shard_id']} ({self.kind}, round {self.shard['round']})"

    def _result(self, cfg: RunConfig, manifest: dict[str, Any]) -> dict[str, Any]:
        return {
            "shard_id": self.shard["shard_id"],
            "round": self.shard["round"],
            "records": self.shard["records"],
            "counts": manifest.get("counts", {}),
        }

    def _deadline(self, context: Context) -> float | None:
        if self.execution_timeout is None:
            return None
        start = context["ti"].start_date
        started = start.timestamp() if start else time.time()
        return started + self.execution_timeout.total_seconds()

    # ------------------------------------------------------------------------------- execute
    def execute(self, context: Context) -> dict[str, Any] | None:
        cfg = self._config()
        spec = self._spec(cfg)
        ep = pool_endpoints(self.worker_pool)

        async def check() -> dict[str, Any] | None:
            client = self._client(ep)
            try:
                return await client.finished(spec)
            finally:
                await client.aclose()

        done = asyncio.run(check())
        if done is not None:
            self.log.info("%s: finished earlier with the same fingerprint; not run again", self._what())
            return self._result(cfg, done)
        renew_lease(self.worker_pool, context, self.log)
        return self._submit(context, spec, ep, resubmits=0)

    def _submit(
        self, context: Context, spec: JobSpec, ep: PoolEndpoints, resubmits: int
    ) -> dict[str, Any] | None:
        deadline = self._deadline(context)

        async def submit() -> tuple[str, dict[str, Any] | None]:
            client = self._client(ep)
            try:
                url, status = await client.submit_when_free(
                    spec, deadline=time.monotonic() + SUBMIT_TIMEOUT_S
                )
                waited = time.monotonic() + self.inline_wait_s
                while status.state not in TERMINAL_STATES and time.monotonic() < waited:
                    await asyncio.sleep(min(0.5, self.poll_interval_s))
                    try:
                        status = await client.clients[url].status(spec.job_id)
                    except RpcError:
                        break  # the trigger handles lost workers
                if status.state in TERMINAL_STATES:
                    return url, {"state": status.state, "error": status.error, "counts": status.counts}
                return url, None
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
        self.log.info("%s: job %s submitted to %s (%d records)", self._what(), spec.job_id, url,
                      self.shard["records"])  # fmt: skip
        if event is not None:
            return self.execute_complete(context, event, url=url, resubmits=resubmits)
        timeout = None if deadline is None else timedelta(seconds=max(1.0, deadline - time.time() + 60))
        self.defer(
            trigger=WorkerJobTrigger(
                worker_pool=self.worker_pool,
                url=url,
                job_id=spec.job_id,
                deadline=deadline,
                poll_interval_s=self.poll_interval_s,
                lost_grace_s=self.lost_grace_s,
            ),
            method_name="execute_complete",
            kwargs={"url": url, "resubmits": resubmits},
            timeout=timeout,
        )
        return None  # not reached: defer() raises

    def execute_complete(
        self, context: Context, event: dict[str, Any], url: str = "", resubmits: int = 0
    ) -> dict[str, Any] | None:
        cfg = self._config()
        spec = self._spec(cfg)
        state = event.get("state")
        if state == "succeeded":
            manifest = read_job_manifest(spec.outputs["manifest"], self.storage_options)
            if manifest is None:
                raise AirflowException(f"{self._what()}: the worker reports success but "
                                       f"{spec.outputs['manifest']} is missing")  # fmt: skip
            self.log.info("%s: done on %s: %s", self._what(), url, manifest.get("counts"))
            return self._result(cfg, manifest)
        if state == "lost":
            manifest = read_job_manifest(spec.outputs["manifest"], self.storage_options)
            if manifest is not None:
                return self._result(cfg, manifest)  # it finished before the worker went away
            if resubmits >= self.max_resubmits:
                self._fail(cfg, f"lost {resubmits + 1} times (last: {event.get('reason')})")
            self.log.warning("%s: %s; resubmitting", self._what(), event.get("reason"))
            return self._submit(context, spec, pool_endpoints(self.worker_pool), resubmits + 1)
        if state == "timeout":
            self._fail(cfg, f"did not finish within execution_timeout ({self.execution_timeout})")
        self._fail(cfg, f"{state} on {url}: {event.get('error')}")
        return None

    def _fail(self, cfg: RunConfig, error: str) -> None:
        record_job_error(cfg, int(self.shard["round"]), self.shard["shard_id"], self.kind, error,
                         self.storage_options)  # fmt: skip
        raise AirflowException(
            f"{self._what()} {error}. Remedy: see the worker log for the record that failed; Airflow retries "
            "the task, and after the last retry the round's close quarantines the shard into failed/."
        )


class InferShardOperator(ShardJobOperator):
    """Generate for every record of the shard; returns the judge's input descriptor."""

    kind = "infer"

    def _result(self, cfg: RunConfig, manifest: dict[str, Any]) -> dict[str, Any]:
        r = int(self.shard["round"])
        shard = cast(ShardDescriptor, self.shard)
        return {**inferred_shard(cfg, r, shard), "round": r, "counts": manifest.get("counts", {})}


class JudgeShardOperator(ShardJobOperator):
    """Judge an inferred shard into approved (results) and rejected (next round's candidates)."""

    kind = "judge"


class InPlaceRetryShardOperator(ShardJobOperator):
    """Retry each sample of the shard inside the worker until approved or ``max_attempts``."""

    kind = "in_place"
