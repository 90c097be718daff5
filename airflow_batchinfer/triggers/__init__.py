"""Triggers (run by Airflow's triggerer, which imports them from this package)."""

from __future__ import annotations

import asyncio
import time

# Airflow 3.3.2 can fail a deferred task whose trigger fires before the scheduler has seen the
# task's deferral ("task-state-changed-externally"): no event leaves a trigger sooner than this.
SETTLE_S = 3.0


async def settle(not_before: float | None) -> None:
    """Wait until ``not_before`` (wall clock) before yielding a trigger's event."""
    if not_before is not None and (wait := not_before - time.time()) > 0:
        await asyncio.sleep(wait)
