"""Terminal progress for long CLI jobs: bytes with MB/s, records with records/s.

The bar draws only on a terminal (tqdm's auto-disable); logs and CI output stay clean.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType

from tqdm import tqdm


class ProgressBar:
    """``with ProgressBar("shard", total_bytes) as bar: work(progress=bar)``; ``bar(records, amount)``
    advances the bar by ``amount`` (bytes, or records with ``unit="rec"``)."""

    def __init__(self, desc: str, total: int | None = None, *, unit: str = "B") -> None:
        self._bar = tqdm(
            desc=desc,
            total=total,
            unit=unit,
            unit_scale=unit == "B",
            unit_divisor=1024 if unit == "B" else 1000,
            file=sys.stderr,
            disable=None,
            dynamic_ncols=True,
        )
        self.records = 0
        self._started = time.monotonic()
        self._last_postfix = 0.0

    def __call__(self, records: int, nbytes: int) -> None:
        self.records += records
        self._bar.update(nbytes)
        now = time.monotonic()
        if now - self._last_postfix >= 0.5:
            self._last_postfix = now
            rate = self.records / max(now - self._started, 1e-9)
            self._bar.set_postfix_str(f"{self.records:,} records, {rate:,.0f} rec/s", refresh=False)

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
