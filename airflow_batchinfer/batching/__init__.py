"""Token-budgeted dynamic batching on asyncio (no I/O): the heart of GPU efficiency.

``DynamicBatcher``, ``TokenBatcher``, ``Prompt`` and ``BatchStats`` keep the names and semantics of
the seed article, so code written for it ports unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_batchinfer.lazy import exports

if TYPE_CHECKING:
    from airflow_batchinfer.batching.batcher import DynamicBatcher
    from airflow_batchinfer.batching.stats import BatchStats
    from airflow_batchinfer.batching.token import Prompt, TokenBatcher

__all__ = [
    "BatchStats",
    "DynamicBatcher",
    "Prompt",
    "TokenBatcher",
]
# Imported on first use: importing one module of the package loads no other.
__getattr__, __dir__ = exports(
    __name__,
    __all__,
    {
        "batcher": ("DynamicBatcher",),
        "stats": ("BatchStats",),
        "token": ("Prompt", "TokenBatcher"),
    },
)
