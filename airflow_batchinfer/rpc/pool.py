"""A client for a pool of workers: submit to the least-loaded one, move on at 429, track jobs to
completion and resubmit lost ones, with the completion manifest as the truth.

A job id runs on at most one worker: before submitting, the client asks the workers it knows whether
one already has the job, and follows it there (an Airflow retry, a re-run or a resubmission never
starts a second copy of a job that still runs). The workers asked are every one the pool says may
run a job (:class:`~airflow_batchinfer.rpc.locate.Workers`: on Kubernetes a pod that is not Ready or
is draining too), not only those new jobs go to. A worker that does not answer may still run it: the
client asks again until it answers, the pool no longer lists it at all, its address refuses
connections, or it has been silent for ``unreachable_grace_s``
(:func:`~airflow_batchinfer.rpc.locate.locate_decision` decides)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import httpx

from airflow_batchinfer.exceptions import (
    JobFailed,
    JobNotFound,
    JobTimeout,
    RpcError,
    StorageError,
    WorkerBusy,
    WorkerUnavailable,
)
from airflow_batchinfer.rpc.client import WorkerClient
from airflow_batchinfer.rpc.fingerprint import fingerprint, pin_input, spec_input_info
from airflow_batchinfer.rpc.locate import (
    LOCATE_TIMEOUT_S,
    UNREACHABLE_GRACE_S,
    Located,
    WorkerAnswer,
    Workers,
    locate_decision,
)
from airflow_batchinfer.rpc.models import MAX_WAIT_S, JobSpec, JobStatus
from airflow_batchinfer.rpc.tracking import JobEvent, Observation, after_event, event_for, next_action
from airflow_batchinfer.state.docs import JobManifest, read_job_manifest
from airflow_batchinfer.storage.location import StorageOptions

if TYPE_CHECKING:
    from airflow_batchinfer.pools.ref import WorkerPool

log = logging.getLogger("airflow_batchinfer.rpc")
Discover = Callable[[], Awaitable[Sequence[str] | Workers]]  # a plain list: Workers.of(it)


def _workers(found: Sequence[str] | Workers) -> Workers:
    return found if isinstance(found, Workers) else Workers.of(found)


def _refused(exc: BaseException, depth: int = 0) -> bool:
    """Whether ``exc`` comes from a connection its address refused (ECONNREFUSED: nothing listens
    there, so nothing runs there). httpx raises the same ``ConnectError`` for an unreachable host or
    network and a failed name lookup, where a cut-off worker may still run its jobs: only the OS
    error under it tells them apart. A group of attempts (several addresses) counts only when every
    one was refused."""
    if isinstance(exc, ConnectionRefusedError):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(_refused(e, depth + 1) for e in exc.exceptions)
    under = exc.__cause__ if exc.__cause__ is not None else exc.__context__
    return under is not None and depth < 16 and _refused(under, depth + 1)


async def ready_workers(urls: Sequence[str], token: str | None, *, timeout_s: float = 5.0) -> list[str]:
    """The workers among ``urls`` that answer ready (model loaded, not draining)."""

    async def ready(url: str) -> bool:
        try:
            async with WorkerClient(url, token=token, timeout=timeout_s) as client:
                return await client.ready()
        except WorkerUnavailable:  # still starting
            return False

    answers = await asyncio.gather(*(ready(u) for u in urls))
    return [u for u, ok in zip(urls, answers, strict=True) if ok]


async def worker_instances(
    urls: Sequence[str], *, probes: int = 4, timeout_s: float = 5.0
) -> dict[str, set[str]]:
    """The worker processes that answer at each of ``urls``: ``probes`` requests each, every one on
    a new connection and all at once, so an address that a Service or load balancer spreads over
    several workers shows more than one. A URL that does not answer has an empty set."""

    async def probe(url: str) -> str | None:
        try:
            async with WorkerClient(url, token=None, timeout=timeout_s) as client:
                return await client.instance()
        except (WorkerUnavailable, RpcError, ValueError, AttributeError):  # not a worker's answer
            return None

    answers = await asyncio.gather(*(probe(u) for u in urls for _ in range(probes)))
    seen: dict[str, set[str]] = {u: set() for u in urls}
    for i, instance in enumerate(answers):
        if instance is not None:
            seen[urls[i // probes]].add(instance)
    return seen


async def follow(
    worker: WorkerClient,
    job_id: str,
    *,
    poll_interval_s: float,
    lost_grace_s: float,
    first: JobStatus | None = None,
    until: float | None = None,
    deadline: float | None = None,
    on_status: Callable[[JobStatus], None] | None = None,
) -> JobEvent | None:
    """Poll ``job_id`` on ``worker`` until the tracker decides (:func:`next_action`), and return the
    event. ``first``: a status already in hand. ``until`` (monotonic): return ``None`` if the job is
    still running then (an inline wait). ``deadline`` (wall clock): a ``timeout`` event past it."""
    url = worker.base_url
    lost_since: float | None = None
    status = first
    wait_s = 0.0  # the next ask's long poll: the job's end is seen when it happens
    while True:
        asked = time.monotonic()
        if status is not None:
            obs = Observation.of(status)
        else:
            try:
                status = await worker.status(job_id, wait_s=wait_s)
                lost_since = None
                if on_status is not None:
                    on_status(status)
                obs = Observation.of(status)
            except JobNotFound:
                obs = Observation("not_found")
            except WorkerUnavailable:
                lost_since = lost_since or time.monotonic()
                obs = Observation("unreachable")
            except RpcError as exc:  # auth or a bad request: polling again will not help
                return JobEvent("failed", job_id, url, error=f"{type(exc).__name__}: {exc}")
        now = time.monotonic()
        action = next_action(obs, lost_since=lost_since, now=now, grace_s=lost_grace_s)
        if action != "wait":
            return event_for(action, obs, job_id=job_id, url=url, lost_for_s=now - (lost_since or now))
        if deadline is not None and time.time() > deadline:
            return JobEvent("timeout", job_id, url, error="past the task's deadline")
        if until is not None and now >= until:
            return None
        # Seen running: ask again at once, as a long poll of up to a poll interval (never past
        # ``until``). Anything else (no answer, an unknown job), or a worker that answered a long poll
        # early while the job still runs (one that predates long polls): wait out the interval.
        interval = poll_interval_s if until is None else min(poll_interval_s, until - now)
        running = obs.seen == "status"
        if not running or (wait_s > 0 and now - asked < 0.9 * wait_s):
            await asyncio.sleep(max(interval - (now - asked), 0.0) if running else interval)
        wait_s = min(interval, MAX_WAIT_S) if running else 0.0
        status = None


class PoolClient:
    """A client over a pool's workers (see the module doc).

    :param urls: worker base URLs, or the pool's :class:`~airflow_batchinfer.rpc.locate.Workers`
        (those to submit to, and those that may still run a job: every one is asked before a copy
        starts).
    :param token: the pool's RPC token.
    :param storage_options: to read completion manifests (the environment by default).
    :param discover: for pools whose workers come and go (Kubernetes): returns the current
        ``Workers`` (a plain list: workers that are both); asked at most every
        ``refresh_interval_s`` when submitting, and at once after a loss.
    :param unreachable_grace_s: how long a silent worker that may run a job holds up its submission
        (the ``unreachable_grace_s`` setting)."""

    def __init__(
        self,
        urls: Sequence[str] | Workers,
        *,
        token: str | None,
        storage_options: StorageOptions | None = None,
        poll_interval_s: float = 1.0,
        lost_grace_s: float = 20.0,
        busy_backoff_s: float = 1.0,
        transport: httpx.AsyncBaseTransport | None = None,
        discover: Discover | None = None,
        refresh_interval_s: float = 5.0,
        max_resubmits: int = 5,
        unreachable_grace_s: float = UNREACHABLE_GRACE_S,
    ) -> None:
        workers = _workers(urls)
        if not workers.may_run and discover is None:
            raise ValueError("a pool needs at least one worker URL")
        self._token, self._transport = token, transport
        self.clients: dict[str, WorkerClient] = {}  # the workers submits go to
        self._known: dict[str, WorkerClient] = {}  # every worker seen: jobs are followed where they run
        self.workers = Workers((), ())  # as the pool lists them now
        self._use(workers)
        self.discover = discover
        self.refresh_interval_s = refresh_interval_s
        self._refreshed = time.monotonic() if workers.may_run else float("-inf")
        self.storage_options = storage_options
        self.poll_interval_s = poll_interval_s
        self.lost_grace_s = lost_grace_s
        self.busy_backoff_s = busy_backoff_s
        self.max_resubmits = max_resubmits
        self.unreachable_grace_s = unreachable_grace_s
        self._silent_since: dict[str, float] = {}  # url -> when it first did not answer (monotonic)
        self._engine: dict[str, Any] | None = None

    @classmethod
    def for_pool(cls, pool: WorkerPool, *, lease_id: str | None = None, **kwargs: Any) -> PoolClient:
        """A client over ``pool``'s workers (``lease_id``'s, where that matters), refreshed from the
        pool as workers come and go (Kubernetes pods, restarted local workers). A fresh client (an
        Airflow retry) knows at once the workers that may still run a job, not only the ready ones."""
        kwargs.setdefault("discover", lambda: asyncio.to_thread(pool.workers, lease_id))
        return cls(pool.workers(lease_id), token=pool.token(), **kwargs)

    def _use(self, workers: Workers) -> None:
        for u in workers.may_run:
            if u not in self._known:
                self._known[u] = WorkerClient(u, token=self._token, transport=self._transport)
        self.clients = {u: self._known[u] for u in workers.submit}
        self.workers = workers

    async def refresh(self, *, force: bool = False) -> None:
        """Take the current workers from ``discover`` (no-op for a fixed pool)."""
        if self.discover is None or (
            not force and time.monotonic() - self._refreshed < self.refresh_interval_s
        ):
            return
        workers = _workers(await self.discover())
        self._refreshed = time.monotonic()
        if set(workers.submit) != set(self.clients):
            log.info("pool workers now: %s", ", ".join(workers.submit) or "none")
        others = set(workers.may_run) - set(workers.submit)
        if others and others != set(self.workers.may_run) - set(self.workers.submit):  # once per change
            log.info("pool workers taking no jobs that may still run some: %s", ", ".join(sorted(others)))
        self._use(workers)

    def worker(self, url: str) -> WorkerClient:
        """The client of a worker this pool client has seen (jobs are followed where they run)."""
        return self._known[url.rstrip("/")]

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self._known.values()))

    async def _free_slots(self, url: str) -> int:
        try:
            s = await self.clients[url].stats()
        except (WorkerUnavailable, WorkerBusy):
            return -1
        return -1 if s.draining else s.slots_total - s.slots_busy

    async def _ask(self, url: str, job_id: str) -> tuple[WorkerAnswer, JobStatus | None]:
        """One worker's answer for ``job_id``; a silent one's time without an answer is tracked."""
        listed = url in self.workers.may_run  # a pod not Ready, or draining, may still run the job
        try:
            status = await self._known[url].status(job_id, timeout=LOCATE_TIMEOUT_S)
        except JobNotFound:
            self._silent_since.pop(url, None)
            return WorkerAnswer(url, listed=listed), None
        except RpcError as exc:  # no answer (or not one to trust): it may still run the job
            since = self._silent_since.setdefault(url, time.monotonic())
            refused = isinstance(exc.__cause__, httpx.ConnectError) and _refused(exc.__cause__)
            silent = WorkerAnswer(
                url,
                answered=False,
                unreachable_s=time.monotonic() - since,
                listed=listed,
                refused=refused,
                error=f"{type(exc).__name__}: {exc}",
            )
            return silent, None
        self._silent_since.pop(url, None)
        return WorkerAnswer(url, state=status.state, listed=listed), status

    async def locate(self, job_id: str) -> tuple[Located, JobStatus | None]:
        """Ask every worker this client knows for ``job_id``: the verdict (``found``, ``not_found``
        or ``unknown``, see :func:`locate_decision`) and, when found, the copy's status. A failed or
        cancelled copy may be resubmitted."""
        await self.refresh()
        asked = await asyncio.gather(*(self._ask(u, job_id) for u in list(self._known)))
        located = locate_decision([a for a, _ in asked], grace_s=self.unreachable_grace_s)
        status = next((s for a, s in asked if a.url == located.url), None)
        return located, status

    async def _running_copy(
        self, spec: JobSpec, *, deadline: float | None = None
    ) -> tuple[str, JobStatus] | None:
        """The live copy of ``spec`` to follow, or ``None`` once no worker that may run it is
        silent. ``WorkerUnavailable`` past ``deadline`` (monotonic) while one still is."""
        while True:
            located, status = await self.locate(spec.job_id)
            for url, why in located.gone:
                log.warning("job %s: worker %s taken for gone (%s)", spec.job_id, url, why)
            if located.verdict == "found":
                assert located.url is not None and status is not None
                log.info(
                    "job %s already %s on %s: following it there", spec.job_id, status.state, located.url
                )
                return located.url, status
            if located.verdict == "not_found":
                return None
            waiting = "; ".join(f"{url} ({why})" for url, why in located.waiting)
            if deadline is not None and time.monotonic() > deadline:
                raise WorkerUnavailable(
                    f"job {spec.job_id}: not started, as {waiting} may still run it and does not answer. "
                    "Remedy: check that worker (`batchinfer pool status`); once it answers, or once the pool "
                    "no longer lists it or unreachable_grace_s passes, a retry follows or starts the job."
                )
            log.warning(
                "job %s: not starting a copy while a worker that may run it is silent: %s; asking "
                "again in %.0f s",
                spec.job_id,
                waiting,
                self.poll_interval_s,
            )
            await asyncio.sleep(self.poll_interval_s)
            await self.refresh(force=True)

    async def cancel(self, url: str, job_id: str) -> JobStatus | None:
        """Cancel ``job_id`` on ``url`` (a task that times out or is killed); ``None`` if it is gone."""
        try:
            return await self.worker(url).cancel(job_id)
        except (KeyError, JobNotFound, WorkerUnavailable):
            return None

    async def submit(
        self, spec: JobSpec, *, avoid: str | None = None, locate: bool = True
    ) -> tuple[str, JobStatus]:
        """Follow the copy of ``spec`` a worker already runs (``locate``), else submit to the worker
        with the most free slots; on 429 try the next. ``WorkerBusy`` if every worker is full,
        ``WorkerUnavailable`` if none answers."""
        if locate and (found := await self._running_copy(spec)) is not None:
            return found
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
        self, spec: JobSpec, *, deadline: float | None = None, locate: bool = True
    ) -> tuple[str, JobStatus]:
        """:meth:`submit`, waiting for a free slot until ``deadline`` (monotonic). The workers are
        asked for a running copy until every one that may run it answers (or ``deadline``), not at
        every wait for a slot."""
        if locate and (found := await self._running_copy(spec, deadline=deadline)) is not None:
            return found
        while True:
            try:
                return await self.submit(spec, locate=False)
            except (WorkerBusy, WorkerUnavailable):
                if deadline is not None and time.monotonic() > deadline:
                    raise
                await asyncio.sleep(self.busy_backoff_s)
                await self.refresh(force=True)

    def _manifest(self, spec: JobSpec) -> JobManifest | None:
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
        """``spec`` pinned to the current version of its input (see :func:`pin_input`,
        :func:`spec_input_info`)."""
        info = await asyncio.to_thread(spec_input_info, spec, self.storage_options)
        return pin_input(spec, info)

    async def finished(self, spec: JobSpec) -> JobManifest | None:
        """The completion manifest of an earlier identical run of ``spec``, or ``None``.

        Identical means the same fingerprint (engine and model, templates, judge, sampling, input
        file): finished work is never paid for twice, and a stale result is never reused.
        """
        manifest = await asyncio.to_thread(self._manifest, spec)
        if manifest is None:
            return None
        info = await asyncio.to_thread(spec_input_info, spec, self.storage_options)
        expected = fingerprint(spec, await self.engine(), info)
        if manifest.fingerprint != expected:
            log.info(
                "job %s: %s is stale (other settings or input): recomputing",
                spec.job_id,
                spec.outputs["manifest"],
            )
            return None
        return manifest

    async def run(
        self,
        spec: JobSpec,
        *,
        timeout_s: float | None = None,
        on_status: Callable[[JobStatus], None] | None = None,
    ) -> JobManifest:
        """Run ``spec`` to completion on the pool; returns its completion manifest.

        A finished identical job (see :meth:`finished`) is not run again; a copy a worker already
        runs is followed. Lost workers and jobs are resubmitted (up to ``max_resubmits`` times).
        Raises :class:`JobFailed` when the job fails (the worker's reason inside), :class:`JobTimeout`
        (after cancelling the job) past ``timeout_s``.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        wall_deadline = None if timeout_s is None else time.time() + timeout_s
        spec = await self.pinned(spec)
        done = await self.finished(spec)
        if done is not None:
            return done
        url, status = await self.submit_when_free(spec, deadline=deadline)
        resubmits = 0
        while True:
            event = await follow(
                self.worker(url),
                spec.job_id,
                first=status,
                poll_interval_s=self.poll_interval_s,
                lost_grace_s=self.lost_grace_s,
                deadline=wall_deadline,
                on_status=on_status,
            )
            assert event is not None  # no `until`: follow() returns only with a decision
            manifest = None
            if event.state in ("succeeded", "lost"):
                manifest = await asyncio.to_thread(self._manifest, spec)
            outcome = after_event(
                event,
                manifest=manifest,
                resubmits=resubmits,
                max_resubmits=self.max_resubmits,
            )
            if outcome == "done":
                assert manifest is not None
                return manifest
            if outcome == "fail":
                if event.state == "timeout":
                    await self.cancel(url, spec.job_id)
                    raise JobTimeout(f"job {spec.job_id} did not finish within {timeout_s} s (cancelled)")
                if event.state == "succeeded":
                    raise StorageError(
                        f"job {spec.job_id} succeeded but {spec.outputs['manifest']} is missing"
                    )
                raise JobFailed(spec.job_id, event.state, event.error)
            log.warning("job %s lost on %s (%s): resubmitting", spec.job_id, url, event.error)
            resubmits += 1
            await self.refresh(force=True)
            url, status = await self.submit_when_free(spec, deadline=deadline)
