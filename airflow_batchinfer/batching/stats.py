"""Batcher statistics: a frozen snapshot, cheap to take at any time."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class BatchStats:
    """What a batcher has done so far.

    Read ``utilization`` together with ``avg_fill``:

    * high utilization, high fill: the engine is busy with full batches. Ideal.
    * high utilization, low fill: the engine is busy with small batches; it would do more per
      second with fuller ones. Raise ``batch_timeout_s`` or ``prefetch_batches``, or submit more
      concurrently.
    * low utilization, high fill: producers can't keep up; the engine waits for work. Add
      producers/jobs, or read input faster.
    * low utilization, low fill: too little work is arriving at all.

    ``closed_by`` says why batches closed: ``cost`` (reached the target), ``size``
    (``max_batch_size``), ``timeout`` (``batch_timeout_s`` with the engine free) or ``drain``
    (``stop()``). Many ``timeout`` closes with low fill mean the batcher is starved.
    """

    total_submitted: int = 0
    total_completed: int = 0
    total_failed: int = 0
    total_batches: int = 0
    total_batch_cost: float = 0.0
    busy_time_s: float = 0.0
    idle_time_s: float = 0.0
    target_batch_cost: float = 0.0
    max_batch_size: int = 0
    queue_depth: int = 0
    closed_by: dict[str, int] = field(default_factory=dict)

    @property
    def avg_batch_size(self) -> float:
        return (self.total_completed + self.total_failed) / self.total_batches if self.total_batches else 0.0

    @property
    def avg_batch_cost(self) -> float:
        return self.total_batch_cost / self.total_batches if self.total_batches else 0.0

    @property
    def avg_fill(self) -> float:
        """Average batch cost as a fraction of ``target_batch_cost`` (may exceed 1: the crossing
        record is admitted whole)."""
        return self.avg_batch_cost / self.target_batch_cost if self.target_batch_cost else 0.0

    @property
    def utilization(self) -> float:
        """``busy / (busy + idle)``: the fraction of time the processing function was running."""
        total = self.busy_time_s + self.idle_time_s
        return self.busy_time_s / total if total else 0.0

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            avg_batch_size=self.avg_batch_size,
            avg_batch_cost=self.avg_batch_cost,
            avg_fill=self.avg_fill,
            utilization=self.utilization,
        )
        return out
