"""The engine's own figures over time (:meth:`~airflow_batchinfer.engines.base.Engine.stats`): what
``/metrics`` shows and each job's manifest records (``engine_stats``).

While jobs run, one task reads the engine's stats every :data:`SAMPLE_INTERVAL_S`; each job has a
:class:`Window` that keeps its gauges' peak and mean over those readings and its counters at the
start, and becomes the manifest's :class:`~airflow_batchinfer.state.docs.EngineTelemetry` when the job
ends. No job running: no task (the readings cost nothing then). Tokens per second on ``/metrics``
come from the readings of the last :data:`RATE_WINDOW_S` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from airflow_batchinfer.engines.base import Engine
from airflow_batchinfer.engines.stats import CounterName, EngineStats, GaugeName
from airflow_batchinfer.state.docs import EngineTelemetry, GaugeSpan

log = logging.getLogger("airflow_batchinfer.worker")

SAMPLE_INTERVAL_S = 1.0  # a reading a second while jobs run: a few attribute reads each
RATE_WINDOW_S = 10.0  # the tokens-per-second gauges average over this much of the past
RATES: tuple[CounterName, ...] = ("generation_tokens", "prompt_tokens")  # the counters given per second


@dataclass
class _Gauge:
    peak: float
    total: float = 0.0
    readings: int = 0

    def add(self, value: float) -> None:
        self.peak = max(self.peak, value)
        self.total += value
        self.readings += 1


@dataclass(eq=False)
class Window:
    """One job's view of the engine: its counters when the job started and its gauges since."""

    started_at: float
    t0: float
    at_start: dict[CounterName, int]
    gauges: dict[GaugeName, _Gauge] = field(default_factory=dict)
    readings: int = 0

    def add(self, stats: EngineStats) -> None:
        self.readings += 1
        for name, value in stats.gauges().items():
            gauge = self.gauges.get(name)
            if gauge is None:
                gauge = self.gauges[name] = _Gauge(value)
            gauge.add(value)

    def figures(self, end: EngineStats, now: float, engine_id: str) -> EngineTelemetry:
        counters = end.counters()
        return EngineTelemetry(
            engine_id=engine_id,
            started_at=self.started_at,
            seconds=round(now - self.t0, 3),
            samples=self.readings,
            counters={k: counters[k] - v for k, v in self.at_start.items() if k in counters},
            at_start=self.at_start,
            gauges={
                k: GaugeSpan(peak=round(g.peak, 4), mean=round(g.total / g.readings, 4))
                for k, g in self.gauges.items()
            },
        )


class Telemetry:
    """The engine's readings for one worker: :meth:`open` a window when a job starts, :meth:`close`
    it for the job's manifest (or :meth:`discard` it), :meth:`read` for ``/metrics``."""

    def __init__(
        self,
        engine: Engine,
        *,
        interval_s: float = SAMPLE_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.interval_s = interval_s
        self.clock = clock
        self.engine_id = uuid.uuid4().hex[:16]  # the counters below count from this process's start
        self._windows: list[Window] = []
        self._recent: deque[tuple[float, EngineStats]] = deque()
        self._task: asyncio.Task[None] | None = None
        self._failed = False

    def read(self) -> EngineStats | None:
        """The engine's stats now (``None``: it keeps none), remembered for :meth:`rates`."""
        try:
            stats = self.engine.stats()
        except Exception:  # telemetry never fails a job or a scrape
            if not self._failed:
                log.exception("engine %s: reading its stats failed; none reported", self.engine.name)
            self._failed = True
            return None
        if stats is not None:
            now = self.clock()
            self._recent.append((now, stats))
            while self._recent and self._recent[0][0] < now - RATE_WINDOW_S:
                self._recent.popleft()
        return stats

    def rates(self) -> dict[str, float]:
        """Per second over the readings of the last :data:`RATE_WINDOW_S` (0 with fewer than two)."""
        if len(self._recent) < 2:
            return {}
        (t0, first), (t1, last) = self._recent[0], self._recent[-1]
        if t1 <= t0:
            return {}
        a, b = first.counters(), last.counters()
        return {k: (b[k] - a[k]) / (t1 - t0) for k in RATES if k in a and k in b}

    def open(self) -> Window | None:
        """A window from now (``None``: the engine keeps no stats)."""
        stats = self.read()
        if stats is None:
            return None
        window = Window(started_at=time.time(), t0=self.clock(), at_start=stats.counters())
        window.add(stats)
        self._windows.append(window)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._sample(), name="engine-telemetry")
        return window

    def close(self, window: Window | None) -> EngineTelemetry | None:
        """The window's figures, ending now; ``None`` when there are none."""
        if window is None or window not in self._windows:
            return None
        stats = self.read()
        self.discard(window)
        if stats is None:
            return None
        window.add(stats)
        return window.figures(stats, self.clock(), self.engine_id)

    def discard(self, window: Window | None) -> None:
        """Forget the window (a job that failed); the readings stop with the last window."""
        if window in self._windows:
            self._windows.remove(window)
        if not self._windows and self._task is not None:
            self._task.cancel()
            self._task = None

    async def _sample(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            stats = self.read()
            if stats is not None:
                for window in self._windows:
                    window.add(stats)
