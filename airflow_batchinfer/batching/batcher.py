"""``DynamicBatcher``: cost-budgeted dynamic batching on one asyncio event loop.

Producers ``submit`` records and get futures; an assembler task groups queued records into batches
(closing on target cost, ``max_batch_size`` or ``batch_timeout_s``) and keeps up to
``prefetch_batches`` ready; a processor task runs ``process_fn`` on one batch at a time and resolves
the futures by position. Names and semantics follow the seed article so code ports unchanged; the
hardening (loop checks, stop races, ``BaseException`` in ``process_fn``) is ours.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import math
from collections.abc import Awaitable, Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, Generic, TypeVar

from airflow_batchinfer.batching.stats import BatchStats
from airflow_batchinfer.exceptions import BatcherError

T = TypeVar("T")  # record
R = TypeVar("R")  # result

ProcessFn = Callable[[list[T]], "Awaitable[Sequence[R]] | Sequence[R]"]
CostEstimator = Callable[[T], float]


class _Item:
    __slots__ = ("cost", "future", "record")

    def __init__(self, record: Any, cost: float, future: asyncio.Future[Any]) -> None:
        self.record = record
        self.cost = cost
        self.future = future


_STOP: Any = object()  # end-of-input marker, in the record queue and then the batch queue
_WAKE: Any = object()  # "the prefetch queue has room": wakes an assembler keeping a batch open


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


class DynamicBatcher(Generic[T, R]):
    """Groups records into batches whose summed cost approaches ``target_batch_cost``.

    :param process_fn: ``async`` (or plain) function from a list of records to a list of results of
        the same length, in the same order. A plain function runs on the event loop: keep it short
        or wrap blocking work in ``asyncio.to_thread``.
    :param cost_estimator: ``record -> cost``; else ``record.estimate_cost()``; else ``default_cost``.
    :param target_batch_cost: a batch closes once its cost reaches this; the record that crosses it
        is admitted whole, and a record that alone reaches it gets a batch of its own.
    :param max_batch_size: a batch closes at this many records.
    :param min_batch_size: a batch that times out with fewer records waits for more, up to
        ``min_batch_wait_s`` longer; ``stop()`` dispatches it regardless. Records are never reordered.
    :param batch_timeout_s: a batch closes this long after its first record was dequeued, if the
        processor can take it; while all prefetch slots are full it keeps filling instead, since
        closing it early would only make it smaller, not sooner.
    :param max_queue_size: queued records beyond which ``submit`` suspends (backpressure).
    :param prefetch_batches: batches assembled ahead of the processor.
    :param default_cost: the cost of a record nothing else estimates.
    :param min_batch_wait_s: see ``min_batch_size``; default ``10 × batch_timeout_s``.
    :param max_concurrent_batches: batches ``process_fn`` may run at once (default 1). Engines with
        continuous batching (vLLM) want several in flight, so their scheduler always has the next
        requests while the longest generations of a batch finish.
    """

    SUBMIT_SLICE = 256  # submit_batch yields to the event loop between slices of this many records

    def __init__(
        self,
        process_fn: ProcessFn[T, R],
        *,
        cost_estimator: CostEstimator[T] | None = None,
        target_batch_cost: float = 32_000,
        max_batch_size: int = 256,
        min_batch_size: int = 1,
        batch_timeout_s: float = 0.05,
        max_queue_size: int = 5_000,
        prefetch_batches: int = 2,
        default_cost: float = 1,
        min_batch_wait_s: float | None = None,
        max_concurrent_batches: int = 1,
    ) -> None:
        _check(callable(process_fn), "process_fn must be callable")
        _check(target_batch_cost > 0, f"target_batch_cost must be > 0, got {target_batch_cost}")
        _check(max_batch_size >= 1, f"max_batch_size must be >= 1, got {max_batch_size}")
        _check(
            1 <= min_batch_size <= max_batch_size,
            f"min_batch_size must be between 1 and max_batch_size ({max_batch_size}), got {min_batch_size}",
        )
        _check(batch_timeout_s >= 0, f"batch_timeout_s must be >= 0, got {batch_timeout_s}")
        _check(max_queue_size >= 1, f"max_queue_size must be >= 1, got {max_queue_size}")
        _check(prefetch_batches >= 1, f"prefetch_batches must be >= 1, got {prefetch_batches}")
        _check(default_cost >= 0, f"default_cost must be >= 0, got {default_cost}")
        _check(min_batch_wait_s is None or min_batch_wait_s >= 0, "min_batch_wait_s must be >= 0")
        _check(
            max_concurrent_batches >= 1, f"max_concurrent_batches must be >= 1, got {max_concurrent_batches}"
        )
        self._process_fn = process_fn
        self._cost_estimator = cost_estimator
        self.target_batch_cost = target_batch_cost
        self.max_batch_size = max_batch_size
        self.min_batch_size = min_batch_size
        self.batch_timeout_s = batch_timeout_s
        self.max_queue_size = max_queue_size
        self.prefetch_batches = prefetch_batches
        self.default_cost = default_cost
        self.min_batch_wait_s = 10 * batch_timeout_s if min_batch_wait_s is None else min_batch_wait_s
        self.max_concurrent_batches = max_concurrent_batches

        self._state = "new"  # new | running | stopping | stopped
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._batches: asyncio.Queue[Any] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._pending_puts = 0  # submits suspended on a full queue; stop() waits for them
        self._want_room = False
        self._stopped = asyncio.Event()
        self._counts = collections.Counter[str]()
        self._closed_by = collections.Counter[str]()
        self._batch_cost = 0.0
        self._busy = 0.0
        self._idle = 0.0

    # ----------------------------------------------------------------------------- lifecycle
    @property
    def is_running(self) -> bool:
        return self._state == "running"

    async def start(self) -> None:
        """Start the assembler and processor on the running loop; ``RuntimeError`` if running."""
        if self._state in ("running", "stopping") and not (self._loop and self._loop.is_closed()):
            raise BatcherError("start() on a batcher that is already running")
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._queue = asyncio.Queue(maxsize=self.max_queue_size)
        self._batches = asyncio.Queue(maxsize=self.prefetch_batches)
        self._pending_puts = 0
        self._want_room = False
        self._stopped = asyncio.Event()
        self._state = "running"
        self._tasks = [
            loop.create_task(self._assemble(), name="batcher-assemble"),
            loop.create_task(self._process(), name="batcher-process"),
        ]

    async def stop(self) -> None:
        """Process everything submitted so far, at once (no timeouts), then stop. Idempotent."""
        if self._state in ("new", "stopped"):
            return
        self._check_loop("stop()")
        if self._state == "stopping":
            await self._stopped.wait()
            return
        self._state = "stopping"
        try:
            if not self._tasks[0].done():
                await self._queue.put(_STOP)
            await asyncio.wait(self._tasks)
        finally:
            self._state = "stopped"
            self._fail_leftovers(BatcherError("the batcher stopped before this record was processed"))
            self._stopped.set()

    async def __aenter__(self) -> DynamicBatcher[T, R]:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    # ------------------------------------------------------------------------------- submit
    async def submit(self, record: T, *, estimated_cost: float | None = None) -> asyncio.Future[R]:
        """Queue one record; returns its future once queued. Suspends only while the queue is full."""
        return await self._submit(record, self._cost(record, estimated_cost))

    async def submit_batch(
        self, records: Iterable[T], *, estimated_cost: float | Sequence[float] | None = None
    ) -> list[asyncio.Future[R]]:
        """Queue several records in order; ``estimated_cost`` is one cost for all or one per record."""
        items = list(records)
        if isinstance(estimated_cost, Sequence):
            if len(estimated_cost) != len(items):
                raise ValueError(
                    f"estimated_cost has {len(estimated_cost)} costs for {len(items)} records; pass one "
                    "cost per record, or a single cost for all"
                )
            costs: Sequence[float | None] = estimated_cost
        else:
            costs = [estimated_cost] * len(items)
        futures: list[asyncio.Future[R]] = []
        for i, (record, cost) in enumerate(zip(items, costs, strict=True)):
            if i and not i % self.SUBMIT_SLICE:
                # A long list is queued in slices: a due timer (an engine batch that just ended)
                # runs between them instead of waiting for the whole list.
                await asyncio.sleep(0)
            futures.append(await self._submit(record, self._cost(record, cost)))
        return futures

    async def _submit(self, record: T, cost: float) -> asyncio.Future[R]:
        self._check_loop("submit()")
        if self._state != "running":
            raise BatcherError(
                "submit() on a batcher that is not running: use `async with batcher:` or await start()"
                if self._state == "new"
                else "submit() after stop(): the batcher no longer accepts records"
            )
        loop = self._loop
        assert loop is not None
        future: asyncio.Future[R] = loop.create_future()
        item = _Item(record, cost, future)
        if self._queue.full():
            self._pending_puts += 1
            try:
                await self._queue.put(item)  # backpressure
            finally:
                self._pending_puts -= 1
        else:
            self._queue.put_nowait(item)
        self._counts["submitted"] += 1
        return future

    def _cost(self, record: T, explicit: float | None) -> float:
        if explicit is not None:
            cost = explicit
        elif self._cost_estimator is not None:
            cost = self._cost_estimator(record)
        else:
            cost = self._intrinsic_cost(record)
        if isinstance(cost, bool) or not isinstance(cost, int | float) or not math.isfinite(cost) or cost < 0:
            raise ValueError(f"record cost must be a finite number >= 0, got {cost!r}")
        return cost

    def _intrinsic_cost(self, record: T) -> float:
        estimate = getattr(record, "estimate_cost", None)
        return float(estimate()) if callable(estimate) else self.default_cost

    def _check_loop(self, what: str) -> None:
        loop = self._loop
        if loop is None:
            return
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            raise BatcherError(f"{what} must be awaited on an event loop") from None
        if current is not loop:
            raise BatcherError(
                f"{what} from another event loop: this batcher was started on a different loop (e.g. an "
                "earlier asyncio.run). Create and start the batcher inside the loop that uses it."
            )

    # ------------------------------------------------------------------------------ internals
    async def _get(self, timeout: float | None) -> Any:
        """The next queue entry, or ``None`` after ``timeout`` seconds."""
        try:
            return self._queue.get_nowait()
        except asyncio.QueueEmpty:
            if timeout is not None and timeout <= 0:
                return None
        try:
            return await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            return None

    def _wait_before_close(self, size: int, opened: float, now: float) -> float | None:
        """How long the forming batch may still wait for records: ``0`` closes it now, ``None``
        waits for a record or for room in the prefetch queue."""
        due = opened + self.batch_timeout_s
        if size < self.min_batch_size:
            due += self.min_batch_wait_s
        if now < due:
            return due - now
        return None if self._batches.full() else 0.0  # engine busy: keep filling, don't close early

    async def _assemble(self) -> None:
        loop = asyncio.get_running_loop()
        target, max_size = self.target_batch_cost, self.max_batch_size
        draining = False
        carry: _Item | None = None
        try:
            while True:
                if carry is not None:
                    first, carry = carry, None
                elif draining and self._queue.empty() and not self._pending_puts:
                    break
                else:
                    first = await self._queue.get()
                if first is _STOP:
                    draining = True
                    continue
                if first is _WAKE:
                    continue
                batch, cost = [first], first.cost
                opened = loop.time()
                reason = ""
                while not reason:
                    if cost >= target:
                        reason = "cost"
                        break
                    if len(batch) >= max_size:
                        reason = "size"
                        break
                    item = await self._get(0)
                    if item is None:
                        if draining:
                            if not self._pending_puts:
                                reason = "drain"
                                break
                            item = await self._queue.get()  # a submit that began before stop()
                        else:
                            wait = self._wait_before_close(len(batch), opened, loop.time())
                            if wait == 0:
                                reason = "timeout"
                                break
                            self._want_room = wait is None
                            item = await self._get(wait)
                            self._want_room = False
                            if item is None:
                                continue
                    if item is _WAKE:
                        continue
                    if item is _STOP:
                        draining = True
                        continue
                    if item.cost >= target:  # oversized: it gets a batch of its own
                        carry = item
                        reason = "cost"
                        break
                    batch.append(item)
                    cost += item.cost
                await self._batches.put((batch, cost, reason))
            await self._batches.put(_STOP)
        except BaseException:
            self._tasks[1].cancel()  # no more batches will come: don't leave the processor waiting
            raise

    async def _process(self) -> None:
        loop = asyncio.get_running_loop()
        slots = asyncio.Semaphore(self.max_concurrent_batches)
        running: set[asyncio.Task[None]] = set()
        active = 0
        idle_since = busy_since = loop.time()

        async def run(batch: list[_Item], cost: float, reason: str) -> None:
            released = False

            def release() -> None:
                """``process_fn`` is done with this batch: count it and free its slot, before the
                batch's futures resolve, so the next batch starts ahead of the work their waiters do."""
                nonlocal active, idle_since, released
                if released:
                    return
                released = True
                active -= 1
                if active == 0:  # busy time is the union of running batches
                    idle_since = loop.time()
                    self._busy += idle_since - busy_since
                self._batch_cost += cost
                self._closed_by[reason] += 1
                self._counts["batches"] += 1
                slots.release()

            try:
                await self._run_batch(batch, release)
            finally:
                release()

        try:
            while True:
                await slots.acquire()  # take the next batch only when it can start at once
                entry = await self._batches.get()
                if self._want_room:  # the assembler keeps a batch open while the queue was full
                    self._want_room = False
                    with contextlib.suppress(asyncio.QueueFull):
                        self._queue.put_nowait(_WAKE)
                if entry is _STOP:
                    break
                if active == 0:
                    busy_since = loop.time()
                    self._idle += busy_since - idle_since
                active += 1
                # The slot is freed as soon as process_fn returns (one batch at a time when
                # max_concurrent_batches is 1): the next batch starts while this one's results go out.
                task = loop.create_task(run(*entry))
                running.add(task)
                task.add_done_callback(running.discard)
            if running:
                await asyncio.gather(*running)
        except asyncio.CancelledError:
            for task in running:
                task.cancel()
            raise

    async def _run_batch(self, batch: list[_Item], done: Callable[[], None] | None = None) -> None:
        """Run ``process_fn`` on ``batch`` and resolve its futures; ``done()`` is called as soon as
        ``process_fn`` has returned or raised, before any future resolves (a next batch is started
        before the results of this one are delivered)."""
        try:
            try:
                out = self._process_fn([it.record for it in batch])
                results = await out if inspect.isawaitable(out) else out
            finally:
                if done is not None:
                    done()
            if len(results) != len(batch):
                raise ValueError(
                    f"process_fn returned {len(results)} results for a batch of {len(batch)} records; it "
                    "must return exactly one result per record, in order"
                )
            if done is not None:
                # One loop turn before the results go out: the processor, woken by done(), starts
                # the next batch first, and the work of this batch's waiters runs while it runs.
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            for it in batch:
                it.future.cancel()
            self._counts["failed"] += len(batch)
            if task is not None and task.cancelling():
                raise  # the batcher itself is being cancelled
            return  # process_fn cancelled its own work: that batch is cancelled, the batcher goes on
        except (KeyboardInterrupt, SystemExit) as exc:
            self._fail(batch, exc)
            self._tasks[0].cancel()
            self._fail_leftovers(BatcherError(f"the batcher stopped: process_fn raised {exc!r}"))
            raise
        except BaseException as exc:  # that batch fails; the batcher keeps serving
            self._fail(batch, exc)
            return
        for it, result in zip(batch, results, strict=True):
            if not it.future.done():  # the caller may have cancelled it
                it.future.set_result(result)
        self._counts["completed"] += len(batch)

    def _fail(self, batch: list[_Item], exc: BaseException) -> None:
        for it in batch:
            if not it.future.done():
                it.future.set_exception(exc)
        self._counts["failed"] += len(batch)

    def _fail_leftovers(self, exc: BaseException) -> None:
        for queue in (self._queue, self._batches):
            while not queue.empty():
                entry = queue.get_nowait()
                if entry is _STOP or entry is _WAKE:
                    continue
                self._fail(entry[0] if isinstance(entry, tuple) else [entry], exc)

    # ---------------------------------------------------------------------------------- stats
    @property
    def stats(self) -> BatchStats:
        return BatchStats(
            total_submitted=self._counts["submitted"],
            total_completed=self._counts["completed"],
            total_failed=self._counts["failed"],
            total_batches=self._counts["batches"],
            total_batch_cost=self._batch_cost,
            busy_time_s=self._busy,
            idle_time_s=self._idle,
            target_batch_cost=self.target_batch_cost,
            max_batch_size=self.max_batch_size,
            queue_depth=self._queue.qsize(),
            closed_by=dict(self._closed_by),
        )
