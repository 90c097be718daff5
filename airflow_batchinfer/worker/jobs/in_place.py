"""The ``in_place`` job (strategy 2): each sample retried against the warm engine until approved
or ``max_attempts``, its state checkpointed (:mod:`~airflow_batchinfer.worker.checkpoints`) so a
later attempt of the job resumes it; its samples counted by outcome and per adapter, its attempts
and truncated attempts (:class:`~airflow_batchinfer.state.tally.Tally`)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from airflow_batchinfer.judges.truncation import LENGTH
from airflow_batchinfer.prompts.build import PromptBuilder, PromptError
from airflow_batchinfer.prompts.retries import Previous, previous_of
from airflow_batchinfer.state.tally import Tally
from airflow_batchinfer.storage.records import Record
from airflow_batchinfer.worker.checkpoints import CheckpointLog, SampleState
from airflow_batchinfer.worker.jobs.context import JobContext
from airflow_batchinfer.worker.jobs.infer import fed_back, generated, least_max_tokens, output_row
from airflow_batchinfer.worker.jobs.judge import count_adapter, judge_rows


def _checkpointed(previous: Previous | None, prompts: PromptBuilder, attempt: int) -> dict[str, Any] | None:
    """What an in-place checkpoint keeps of ``previous`` for attempt ``attempt``: all of it when that
    attempt's prompt reads it, else what its ``max_tokens`` is decided from (the answer and reason
    left out: a checkpoint stays small whatever the answers' length)."""
    if previous is None:
        return None
    if not prompts.shows_previous(attempt):
        previous = replace(previous, result=None, reason=None, score=None, note=None)
    return previous.as_dict()


async def run_in_place(ctx: JobContext) -> Tally:
    """Strategy 2: each sample is retried against the warm engine until approved or
    ``max_attempts`` (counting attempts from earlier rounds), in a window of ``chunk_size`` samples
    in flight. A stubborn sample holds one window place, never the job or the worker."""
    p = ctx.params
    prompts = p.prompts
    assert prompts is not None and p.judge is not None
    ctx.progress.total = p.input_records
    log = CheckpointLog(
        ctx.spec.outputs["checkpoints"],
        flush_every=p.checkpoint_every,
        flush_interval_s=p.checkpoint_interval_s,
        storage_options=ctx.runtime.storage_options,
    )
    state: dict[str, SampleState] = await asyncio.to_thread(log.load)
    tally, outcomes = ctx.tally, ctx.tally.outcomes  # counted in place: no chunk's figures to add
    tally.resume.samples = sum(1 for s in state.values() if s.attempts)
    approved_out = ctx.file(ctx.output("approved")).writer()
    rejected_out = ctx.file(ctx.output("rejected")).writer()
    window = asyncio.Semaphore(p.chunk_size)

    async def finish(row: Record) -> None:
        status = row["status"]
        if status == "approved":
            outcomes.approved += 1
        elif status == "max_attempts":
            outcomes.max_attempts += 1
        else:  # "error": its prompt could not be built
            outcomes.error += 1
        count_adapter(tally, row, status)
        if status != "approved":
            ctx.count_rejected(row)
        ctx.count_ids("approved" if status == "approved" else "rejected", (row,))
        await (approved_out if status == "approved" else rejected_out).write(row)
        ctx.progress.done += 1

    async def sample(record: Record) -> None:
        try:
            ctx.count_ids("input", (record,))
            rid = ctx.record_id(record)
            saved = state.get(rid, SampleState())
            if saved.final is not None:
                await finish(saved.final)
                return
            attempt = max(int(record.get("attempts") or 0), saved.attempts)
            # the attempt before: the checkpoint's (a resumed sample renders the prompt it would have),
            # else the one its round's input records (None: a first attempt)
            previous = Previous.from_dict(saved.previous) if saved.previous else previous_of(record)
            while True:
                attempt += 1
                outcomes.attempts += 1
                try:  # inline when quick, else in a thread: a heavy template never holds the loop
                    request = await prompts.abuild(
                        record,
                        request_id=rid,
                        attempt=attempt,
                        previous=previous,
                        least_max_tokens=least_max_tokens(previous, p.truncation),
                    )
                except PromptError as exc:  # permanent: retrying cannot help
                    row = output_row(
                        record,
                        result=None,
                        status="error",
                        error=str(exc),
                        attempts=attempt,
                        round=p.round,
                        judgment={"approved": False, "reason": "prompt_error"},
                        finish_reason="error",
                        max_tokens=None,
                    )
                    await log.record(rid, attempt, row)
                    await finish(row)
                    return
                res = (await ctx.generate([request]))[0]
                fed = fed_back(prompts, attempt, previous)
                row = output_row(record, **generated(res, request), attempts=attempt, round=p.round, **fed)
                if res.finish_reason == LENGTH:
                    tally.truncated += 1  # attempts cut at max_tokens
                ((row, verdict),) = await judge_rows(ctx, [row])
                row["judgment"] = verdict.as_dict()
                if verdict.approved or attempt >= p.max_attempts:
                    row["status"] = "approved" if verdict.approved else "max_attempts"
                    await log.record(rid, attempt, row)
                    await finish(row)
                    return
                previous = previous_of(row)  # what the next attempt is told (and resumes with)
                await log.record(rid, attempt, previous=_checkpointed(previous, prompts, attempt + 1))
        finally:
            window.release()

    flusher = asyncio.create_task(log.run_periodic_flush())
    try:
        async with approved_out, rejected_out, asyncio.TaskGroup() as group:
            async for record in aiter(ctx.read_input()):
                await window.acquire()
                group.create_task(sample(record))
    finally:
        flusher.cancel()
        await asyncio.gather(flusher, return_exceptions=True)
    tally.resume.checkpoint_segments = log.segments_written
    ctx.cleanup.append(log.clear)  # once the manifest records completion, checkpoints have served
    return ctx.counts()
