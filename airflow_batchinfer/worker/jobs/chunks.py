"""Streaming a shard job's input through it in chunks: each chunk processed (its rows, with every
per-record failure a row with a reason, counted into the chunk's figures), then written to the
kind's outputs while the next one is processed; with ``outputs["segments"]``, committed chunk by
chunk as segments (:mod:`~airflow_batchinfer.worker.segments`) that a later attempt resumes after."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from airflow_batchinfer.rpc.fingerprint import fingerprint, spec_input_info
from airflow_batchinfer.state.docs import ID_OUTPUTS
from airflow_batchinfer.storage.digest import IdDigest, record_ids
from airflow_batchinfer.storage.records import Record
from airflow_batchinfer.storage.writer import in_thread
from airflow_batchinfer.worker.jobs.context import JobContext
from airflow_batchinfer.worker.segments import ChunkFigures, JobKey, SegmentDoc, SegmentLog

log = logging.getLogger("airflow_batchinfer.worker")

FIRST_CHUNK = 256  # records in a job's first chunk: enough for an engine batch to start on

Process = Callable[[list[Record], ChunkFigures], Coroutine[Any, Any, list[Record]]]
Split = Callable[[list[Record]], dict[str, list[Record]]]  # a chunk's rows per output name
# What happens to a processed chunk, in chunk order: (index, input records, rows, its figures).
Write = Callable[[int, int, list[Record], ChunkFigures], Awaitable[None]]
Resumed = Callable[[int, list[Record]], Awaitable[bool]]


@dataclass
class _Chunk:
    index: int
    records: int
    rows: list[Record]
    figures: ChunkFigures


async def run_chunks(ctx: JobContext, process: Process, split: Split) -> None:
    """Every chunk of the input through ``process``, its rows into the kind's outputs (``split``):
    streamed into one writer per output, or, with ``outputs["segments"]``, committed chunk by chunk
    as segments and assembled at the end (:func:`_run_segmented`)."""
    if ctx.spec.outputs.get("segments"):
        await _run_segmented(ctx, process, split)
        return
    names = ID_OUTPUTS[ctx.spec.kind]
    async with contextlib.AsyncExitStack() as stack:  # an exception aborts every writer
        writers = {n: await stack.enter_async_context(ctx.file(ctx.output(n)).writer()) for n in names}

        async def write(index: int, records: int, rows: list[Record], figures: ChunkFigures) -> None:
            for name, part in split(rows).items():
                await writers[name].write_many(part)

        await _pipelined(ctx, process, write)


async def _run_segmented(ctx: JobContext, process: Process, split: Split) -> None:
    """The job through its segment log, marked live there while it runs."""
    spec, p = ctx.spec, ctx.params
    info = await asyncio.to_thread(spec_input_info, spec, ctx.runtime.storage_options)
    names = ID_OUTPUTS[spec.kind]
    what = f"job {spec.job_id} (input {spec.input})"
    targets = {n: ctx.output(n) for n in names}  # the final (with staging: this attempt's) files
    key = JobKey(
        job_id=spec.job_id,
        fingerprint=fingerprint(spec, ctx.runtime.describe(), info),
        chunk_size=p.chunk_size,
        outputs=targets,
        what=what,
    )
    segments = SegmentLog(spec.outputs["segments"], key, ctx.attempt, ctx.runtime.storage_options)
    try:
        await _resume_segmented(ctx, process, split, segments)
    except BaseException:  # failed or cancelled: no longer live (a kill leaves the mark for close)
        await asyncio.to_thread(segments.leave)
        raise
    ctx.cleanup.append(segments.clear)  # once the manifest records completion, segments have served


async def _resume_segmented(ctx: JobContext, process: Process, split: Split, segments: SegmentLog) -> None:
    """Resume after the committed segments, commit one per chunk processed now, then assemble the
    final outputs from the chosen segments, in chunk order."""
    p, what, targets = ctx.params, segments.key.what, segments.key.outputs
    prefix = await asyncio.to_thread(segments.load)
    chosen: list[SegmentDoc] = []  # one per chunk, in order: what the outputs are assembled from
    ctx.progress.done += sum(d.records for d in prefix)

    async def resumed(index: int, chunk: list[Record]) -> bool:
        """Whether chunk ``index``'s rows come from its committed segment (its records and ids as
        the segment says): then it is neither inferred nor judged, and its figures are the segment's."""
        nonlocal prefix
        if index >= len(prefix):
            return False
        doc = prefix[index]
        ids = await asyncio.to_thread(IdDigest.of, record_ids(chunk, p.id_field))
        if doc.records == len(chunk) and doc.input.digest() == ids:
            ctx.absorb(ChunkFigures.of(doc))
            chosen.append(doc)
            return True
        log.warning(
            "%s: chunk %d holds %d records (ids %s) but its segment (attempt %s) %d (ids %s): the input is "
            "not what it was; recomputing from chunk %d on",
            what, index, len(chunk), ids, doc.attempt, doc.records, doc.input.digest(), index,
        )  # fmt: skip
        ctx.progress.done -= sum(d.records for d in prefix[index:])
        await asyncio.to_thread(segments.discard, prefix[index:])
        prefix = prefix[:index]
        return False

    async def write(index: int, records: int, rows: list[Record], figures: ChunkFigures) -> None:
        chosen.append(await in_thread(segments.commit, index, records, rows, split, figures))

    await _pipelined(ctx, process, write, resumed)
    for name, target in targets.items():
        await in_thread(segments.assemble, chosen, name, target)
    ctx.progress.done = sum(d.records for d in chosen)
    ctx.tally.resume.records = sum(d.records for d in chosen if d.attempt != ctx.attempt)
    ctx.tally.resume.segments = segments.committed


async def _pipelined(ctx: JobContext, process: Process, write: Write, resumed: Resumed | None = None) -> None:
    """Process chunk k+1 while chunk k is written: the batcher never waits on this job's I/O.
    At most two chunks are in memory per job (and one being read). Each chunk is read, decoded and
    parsed in a thread, in one hop; the first is small, so the engine starts on it at once. A
    chunk ``resumed`` says is done already is read (and checked there), not processed."""
    reader = ctx.read_input()
    pending: asyncio.Task[_Chunk] | None = None
    size = ctx.params.chunk_size

    async def run(index: int, chunk: list[Record]) -> _Chunk:
        figures = ChunkFigures()
        figures.count_ids("input", record_ids(chunk, ctx.params.id_field))
        return _Chunk(index, len(chunk), await process(chunk, figures), figures)

    async def finish(task: asyncio.Task[_Chunk]) -> None:
        done = await task
        await write(done.index, done.records, done.rows, done.figures)
        ctx.absorb(done.figures)  # the job's figures hold what is written
        ctx.progress.done += done.records

    try:
        index = 0
        async for chunk in reader.blocks(size, first=min(size, FIRST_CHUNK)):
            index += 1
            if resumed is not None and await resumed(index - 1, chunk):
                continue
            previous, pending = pending, asyncio.create_task(run(index - 1, chunk))
            if previous is not None:  # a failed write cancels the chunk started meanwhile (finally)
                await finish(previous)
        if pending is not None:
            task, pending = pending, None
            await finish(task)
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
