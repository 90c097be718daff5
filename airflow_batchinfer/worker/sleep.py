"""The worker's engine sleep: free the device while idle, wake before the next batch.

``POST /v1/sleep`` asks for a sleep at a level once the worker has been idle (no running job) for
``after_s`` (counted from the later of the ask and the last job's end); a job submitted meanwhile
cancels it. A job submitted to a sleeping worker starts the wake at once, and every engine batch
passes :meth:`EngineSleep.awake`, which wakes the engine first: no batch ever reaches a sleeping
engine, and a sleep waits for the batches in the engine to end. Nothing is refused for sleeping: a
shared pool's other runs just wait for the wake.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from airflow_batchinfer.engines.base import Engine
from airflow_batchinfer.exceptions import ConfigError

log = logging.getLogger("airflow_batchinfer.worker.sleep")

# How often a pending sleep looks whether the worker is still idle (a job's submit cancels it at once).
POLL_S = 0.25
#: When the worker has been idle since (``time.monotonic``), or ``None`` while a job runs.
IdleSince = Callable[[], float | None]


class EngineSleep:
    """The sleep state of one worker's engine: asleep at :attr:`level`, or awake (``None``)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.level: int | None = None
        self.last_woke_s = 0.0  # the last wake's seconds
        self._lock = asyncio.Lock()  # one transition at a time, and none while a batch enters
        self._in_engine = 0  # batches in the engine now
        self._drained = asyncio.Event()  # set while no batch is in the engine
        self._drained.set()
        self._pending: asyncio.Task[None] | None = None  # a sleep waiting for the worker to idle
        self._going = False  # the pending sleep has started: a cancel would leave it half done
        self._waking: asyncio.Task[float] | None = None  # a wake a job's submit started

    @property
    def sleeping(self) -> bool:
        return self.level is not None

    @property
    def pending(self) -> bool:
        """A sleep is asked for and not done yet (waiting for the worker to be idle long enough)."""
        return self._pending is not None and not self._pending.done()

    def refusal(self, level: int) -> str | None:
        """Why the engine cannot sleep at ``level`` (``None``: it can)."""
        return self.engine.sleep_refusal(level)

    def ask(self, level: int, after_s: float, idle_since: IdleSince) -> None:
        """Sleep at ``level`` once ``idle_since`` says the worker has been idle ``after_s`` (a pending
        ask is replaced). Raises :class:`~airflow_batchinfer.exceptions.ConfigError` with the
        engine's refusal."""
        self._refuse(level)
        self.cancel()
        self._pending = asyncio.create_task(self._when_idle(level, after_s, idle_since), name="sleep")
        self._pending.add_done_callback(_log_failure)

    async def sleep_now(self, level: int) -> None:
        """Asleep at ``level`` now (a pending ask dropped); raises as :meth:`ask` does."""
        self._refuse(level)
        self.cancel()
        await self.sleep(level)

    def _refuse(self, level: int) -> None:
        if (why := self.refusal(level)) is not None:
            raise ConfigError(why)

    def cancel(self) -> None:
        """Drop a pending sleep (one that has started goes on: the next batch wakes the engine)."""
        if self._pending is not None and not self._going:
            self._pending.cancel()
            self._pending = None

    def job_arrived(self) -> None:
        """A job was submitted: no pending sleep, and a sleeping engine starts waking now (its first
        batch waits in :meth:`awake` for the wake to end)."""
        self.cancel()
        if self.sleeping and (self._waking is None or self._waking.done()):
            self._waking = asyncio.create_task(self.wake(), name="wake")
            self._waking.add_done_callback(_log_failure)

    async def _when_idle(self, level: int, after_s: float, idle_since: IdleSince) -> None:
        asked = time.monotonic()
        while True:
            since = idle_since()
            left = None if since is None else max(since, asked) + after_s - time.monotonic()
            if left is not None and left <= 0:
                break
            await asyncio.sleep(POLL_S if left is None else min(left, POLL_S))
        self._going = True
        try:
            await self.sleep(level)
        finally:
            self._going = False

    async def sleep(self, level: int) -> None:
        """Asleep at ``level`` now, once the batches in the engine have ended (already asleep: as is)."""
        async with self._lock:
            if self.level is not None:
                return
            await self._drained.wait()
            t0 = time.monotonic()
            await self.engine.sleep(level)
            self.level = level
            log.info("engine asleep at level %d (%.2f s)", level, time.monotonic() - t0)

    async def wake(self) -> float:
        """Awake; the seconds the wake took (0: it was awake). A pending sleep is dropped."""
        self.cancel()
        async with self._lock:
            return 0.0 if self.level is None else await self._wake()

    async def _wake(self) -> float:
        t0 = time.monotonic()
        await self.engine.wake()
        self.last_woke_s = round(time.monotonic() - t0, 3)
        log.info("engine awake from level %s in %.2f s", self.level, self.last_woke_s)
        self.level = None
        return self.last_woke_s

    @contextlib.asynccontextmanager
    async def awake(self) -> AsyncIterator[None]:
        """Around each engine batch: the engine is woken first where it sleeps, and stays awake
        until the batch ends (a sleep waits for it)."""
        async with self._lock:
            if self.level is not None:
                await self._wake()
            self._in_engine += 1
            self._drained.clear()
        try:
            yield
        finally:
            self._in_engine -= 1
            if not self._in_engine:
                self._drained.set()

    async def close(self) -> None:
        """Drop a pending sleep and wait for one under way (the engine closes after)."""
        self.cancel()
        async with self._lock:
            pass


def _log_failure(task: asyncio.Task[Any]) -> None:
    """A sleep or wake nobody awaits: its failure goes to the log (the next batch wakes the engine)."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("engine %s failed: %s: %s", task.get_name(), type(exc).__name__, exc)
