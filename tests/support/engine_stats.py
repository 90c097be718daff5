"""What an engine reports of its counters, as the stats tests read it."""

from __future__ import annotations

import dataclasses

from airflow_batchinfer.engines.stats import EngineStats


def reported(stats: EngineStats | None) -> set[str]:
    return {k for k, v in dataclasses.asdict(stats or EngineStats()).items() if v is not None}
