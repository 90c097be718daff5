"""In-place retry checkpoints: per-sample attempt state in batched, atomic segments.

Events ``{id, attempt, final}`` are buffered and written as one segment (a ``part-N.jsonl.zst``
shard under the job's checkpoint directory) every ``flush_every`` events or ``flush_interval_s``
seconds, never one write or one object per sample. A worker killed mid-job loses at most the
unflushed buffer; on resubmission every sample resumes after its last checkpointed attempt, and
samples that already finished are emitted from their stored final rows. An attempt that did not
finish its sample carries ``previous`` (:class:`~airflow_batchinfer.prompts.retries.Previous`, as a dict):
what the next attempt is told, so a resumed sample renders the prompt (and runs with the
``max_tokens``) it would have.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from airflow_batchinfer.storage import JsonlDir
from airflow_batchinfer.storage.location import StorageOptions
from airflow_batchinfer.storage.writer import in_thread


@dataclass
class SampleState:
    attempts: int = 0
    final: dict[str, Any] | None = None
    previous: dict[str, Any] | None = None  # the last attempt's, for the next one (retries.Previous)


class CheckpointLog:
    def __init__(
        self,
        uri: str,
        *,
        flush_every: int = 256,
        flush_interval_s: float = 5.0,
        storage_options: StorageOptions | None = None,
    ) -> None:
        self.dir = JsonlDir(uri, storage_options=storage_options)
        self.flush_every = flush_every
        self.flush_interval_s = flush_interval_s
        self._buffer: list[dict[str, Any]] = []
        self._next_index: int | None = None
        self._lock = asyncio.Lock()
        self.segments_written = 0

    def load(self) -> dict[str, SampleState]:
        """State per sample id from every segment written so far (sync; call in a thread)."""
        state: dict[str, SampleState] = {}
        shards = self.dir.shards()
        for shard in shards:
            for event in self.dir.file(shard.name).iter_records():
                s = state.setdefault(str(event["id"]), SampleState())
                if int(event["attempt"]) >= s.attempts:
                    s.attempts = int(event["attempt"])
                    s.previous = event.get("previous")
                if event.get("final") is not None:
                    s.final = event["final"]
        self._next_index = shards[-1].index + 1 if shards else 0
        return state

    async def record(
        self,
        sample_id: str,
        attempt: int,
        final: dict[str, Any] | None = None,
        *,
        previous: dict[str, Any] | None = None,
    ) -> None:
        """Checkpoint ``attempt`` of a sample: its ``final`` row, or the ``previous`` the next attempt
        is told."""
        event: dict[str, Any] = {"id": sample_id, "attempt": attempt, "final": final}
        if previous is not None:
            event["previous"] = previous
        self._buffer.append(event)
        if len(self._buffer) >= self.flush_every:
            await self.flush()

    async def flush(self) -> None:
        async with self._lock:
            if not self._buffer:
                return
            events, self._buffer = self._buffer, []
            # A cancelled flush still waits for its segment: the final flush must not write another
            # segment with the same index alongside it.
            await in_thread(self._write_segment, events)

    def _write_segment(self, events: list[dict[str, Any]]) -> None:
        with self.dir.writer_sync(max_records_per_shard=len(events) + 1, start_index=self._next_index) as w:
            w.write_many(events)
        self._next_index = (self._next_index or 0) + 1
        self.segments_written += 1

    async def run_periodic_flush(self) -> None:
        """Flush every ``flush_interval_s`` until cancelled (then flush once more)."""
        try:
            while True:
                await asyncio.sleep(self.flush_interval_s)
                await self.flush()
        finally:
            await asyncio.shield(self.flush())

    def clear(self) -> None:
        self.dir.delete_shards()
