"""A client for a pool of workers: submit to the least-loaded one, move on at 429, track jobs to
completion and resubmit lost ones, with the completion manifest as the truth."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal

import httpx

from airflow_batchinfer.exceptions import JobFailed, JobNotFound, StorageError, WorkerBusy, WorkerUnavailable
from airflow_batchinfer.rpc.client import WorkerClient
from airflow_batchinfer.rpc.fingerprint import fingerprint, pin_input
from airflow_batchinfer.rpc.models import JobSpec, JobStatus
from airflow_batchinfer.rpc.tracking import Observation, next_action
from airflow_batchinfer.storage import JsonlFile
from airflow_batchinfer.storage.location import StorageOptions
from airflow_batchinfer.worker.manifest import read_job_manifest

log = logging.getLogger("airflow_batchinfer.rpc")


class PoolClient:
    """:param urls: worker base URLs. :param token: the pool's RPC token.
    :param storage_options: to read completion manifests (the environment by default).
    :param discover: for pools whose workers come and go (Kubernetes): returns the current worker
        URLs; asked at most every ``refresh_interval_s`` when submitting, and at once after a loss."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        token: str | None,
        storage_options: StorageOptions | None = None,
        poll_interval_s: float = 1.0,
        lost_grace_s: float = 20.0,
        busy_backoff_s: float = 1.0,
        transport: httpx.AsyncBaseTransport | None = None,
        discover: Callable[[], Awaitable[Sequence[str]]] | None = None,
        refresh_interval_s: float = 5.0,
    ) -> None:
        if not urls and discover is None:
            raise ValueError("a pool needs at least one worker URL")
        self._token, self._transport = token, transport
        self.clients: dict[str, WorkerClient] = {}  # the workers submits go to
        self._known: dict[str, WorkerClient] = {}  # every worker seen: jobs are followed where they run
        self._use(urls)
        self.discover = discover
        self.refresh_interval_s = refresh_interval_s
        self._refreshed = time.monotonic() if urls else float("-inf")
        self.storage_options = storage_options
        self.poll_interval_s = poll_interval_s
        self.lost_grace_s = lost_grace_s
        self.busy_backoff_s = busy_backoff_s
        self._engine: dict[str, Any] | None = None

    def _use(self, urls: Sequence[str]) -> None:
        for u in urls:
            u = u.rstrip("/")
            if u not in self._known:
                self._known[u] = WorkerClient(u, token=self._token, transport=self._transport)
        self.clients = {u.rstrip("/"): self._known[u.rstrip("/")] for u in urls}

    async def refresh(self, *, force: bool = False) -> None:
        """Take the current worker list from ``discover`` (no-op for a fixed pool)."""
        if self.discover is None or (
            not force and time.monotonic() - self._refreshed < self.refresh_interval_s
        ):
            return
        urls = list(await self.discover())
        self._refreshed = time.monotonic()
        if set(urls) != set(self.clients):
            log.info("pool workers now: %s", ", ".join(urls) or "none")
        self._use(urls)

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self._known.values()))

    async def _free_slots(self, url: str) -> int:
        try:
            s = await self.clients[url].stats()
        except (WorkerUnavailable, WorkerBusy):
            return -1
        return -1 if s.draining else s.slots_total - s.slots_busy

    async def submit(self, spec: JobSpec, *, avoid: str | None = None) -> tuple[str, JobStatus]:
        """Submit to the worker with the most free slots; on 429 try the next. ``WorkerBusy`` if
        every worker is full, ``WorkerUnavailable`` if none answers."""
        await self.refresh()
        urls = list(self.clients)
        free = await asyncio.gather(*(self._free_slots(u) for u in urls))
        ranked = sorted((f, u != avoid, u) for f, u in zip(free, urls, strict=True) if f >= 0)
        if not ranked:
            raise WorkerUnavailable(f"no worker of the pool answers ({', '.join(urls)})")
        for _, _, url in reversed(ranked):
            try:
                return url, await self.clients[url].submit(spec)
            except (WorkerBusy, WorkerUnavailable):
                continue
        raise WorkerBusy(f"all {len(ranked)} reachable workers are busy")

    async def submit_when_free(
        self, spec: JobSpec, *, deadline: float | None = None
    ) -> tuple[str, JobStatus]:
        while True:
            try:
                return await self.submit(spec)
            except (WorkerBusy, WorkerUnavailable):
                if deadline is not None and time.monotonic() > deadline:
                    raise
                await asyncio.sleep(self.busy_backoff_s)
                await self.refresh(force=True)

    def _manifest(self, spec: JobSpec) -> dict[str, Any] | None:
        return read_job_manifest(spec.outputs["manifest"], self.storage_options)

    async def engine(self) -> dict[str, Any]:
        """What the pool's workers run (engine, model, engine args): any worker that answers."""
        if self._engine is None:
            await self.refresh()
            for client in self.clients.values():
                try:
                    self._engine = (await client.stats()).engine
                    break
                except (WorkerUnavailable, WorkerBusy):
                    continue
            else:
                raise WorkerUnavailable(f"no worker of the pool answers ({', '.join(self.clients)})")
        return self._engine

    async def pinned(self, spec: JobSpec) -> JobSpec:
        """``spec`` pinned to the current version of its input file (see :func:`pin_input`)."""
        info = await asyncio.to_thread(JsonlFile(spec.input, storage_options=self.storage_options).info)
        return pin_input(spec, info)

    async def finished(self, spec: JobSpec) -> dict[str, Any] | None:
        """The completion manifest of an earlier identical run of ``spec``, or ``None``.

        Identical means the same fingerprint (engine and model, templates, judge, sampling, input
        file): finished work is never paid for twice, and a stale result is never reused.
        """
        manifest = await asyncio.to_thread(self._manifest, spec)
        if manifest is None:
            return None
        info = await asyncio.to_thread(JsonlFile(spec.input, storage_options=self.storage_options).info)
        expected = fingerprint(spec, await self.engine(), info)
        if manifest.get("fingerprint") != expected:
            log.info("job %s: %s is stale (other settings or input): recomputing", spec.job_id,
                     spec.outputs["manifest"])  # fmt: skip
            return None
        return manifest

    async def run(
        self,
        spec: JobSpec,
        *,
        timeout_s: float | None = None,
        on_status: Callable[[JobStatus], None] | None = None,
    ) -> dict[str, Any]:
        """Run ``spec`` to completion on the pool; returns its completion manifest.

        A finished identical job (see :meth:`finished`) is not run again. Lost workers and jobs are
        resubmitted.
        Raises :class:`JobFailed` when the job fails (the worker's reason inside).
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        spec = await self.pinned(spec)
        done = await self.finished(spec)
        if done is not None:
            return done
        url, status = await self.submit_when_free(spec, deadline=deadline)
        lost_since: float | None = None
        while True:
            if status.state == "succeeded":
                obs = Observation("status", status.state)
            elif status.state in ("failed", "cancelled"):
                raise JobFailed(spec.job_id, status.state, status.error)
            else:
                await asyncio.sleep(self.poll_interval_s)
                try:
                    status = await self._known[url].status(spec.job_id)
                    lost_since = None
                    if on_status is not None:
                        on_status(status)
                    obs = Observation("status", status.state)
                except (JobNotFound, WorkerUnavailable) as exc:
                    lost_since = lost_since or time.monotonic()
                    seen: Literal["not_found", "unreachable"] = (
                        "not_found" if isinstance(exc, JobNotFound) else "unreachable"
                    )
                    found = await asyncio.to_thread(self._manifest, spec) is not None
                    obs = Observation(seen, manifest_found=found)
            action = next_action(obs, lost_since=lost_since, now=time.monotonic(), grace_s=self.lost_grace_s)
            if action == "done":
                manifest = await asyncio.to_thread(self._manifest, spec)
                if manifest is None:
                    raise StorageError(
                        f"job {spec.job_id} succeeded but {spec.outputs['manifest']} is missing"
                    )
                return manifest
            if action == "failed":
                raise JobFailed(spec.job_id, str(status.state), status.error)
            if action == "resubmit":
                log.warning("job %s lost on %s (%s): resubmitting", spec.job_id, url, obs.seen)
                await self.refresh(force=True)
                url, status = await self.submit_when_free(spec, deadline=deadline)
                lost_since = None
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {spec.job_id} did not finish within {timeout_s} s")
