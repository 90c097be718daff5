"""The ``in_place`` job (strategy 2): each sample retried against the warm engine until approved
or ``max_attempts``, its state checkpointed (:mod:`~airflow_batchinfer.worker.checkpoints`) so a
later attempt of the job resumes it; its samples counted by outcome and per adapter, its attempts
and truncated attempts (:class:`~airflow_batchinfer.state.tally.Tally`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Any

from airflow_batchinfer.engines.base import GenerationRequest
from airflow_batchinfer.engines.images import has_images
from airflow_batchinfer.engines.pooling import GENERATE
from airflow_batchinfer.prompts.build import PromptBuilder, PromptError
from airflow_batchinfer.prompts.retries import Previous, attempts_before, previous_of
from airflow_batchinfer.state.tally import Tally
from airflow_batchinfer.storage.records import Record
from airflow_batchinfer.storage.writer import AsyncWriter
from airflow_batchinfer.worker.checkpoints import CheckpointLog, SampleState
from airflow_batchinfer.worker.jobs import columns
from airflow_batchinfer.worker.jobs.context import JobContext
from airflow_batchinfer.worker.jobs.infer import fed_back, generated, least_budget, output_row, with_images
from airflow_batchinfer.worker.jobs.judge import count_adapter, judge_rows


def _checkpointed(previous: Previous | None, prompts: PromptBuilder, attempt: int) -> dict[str, Any] | None:
    """What an in-place checkpoint keeps of ``previous`` for attempt ``attempt``: all of it when that
    attempt's prompt reads it, else what its ``max_tokens`` is decided from (the answer and reason
    left out: a checkpoint stays small whatever the answers' length)."""
    if previous is None:
        return None
    if not prompts.shows_previous(attempt):
        previous = replace(previous, result=None, reason=None, score=None, note=None)
    return previous.stored()


async def run_in_place(ctx: JobContext) -> Tally:
    """Strategy 2: each sample is retried against the warm engine until approved or
    ``max_attempts`` (counting attempts from earlier rounds), in a window of ``chunk_size`` samples
    in flight. A stubborn sample holds one window place, never the job or the worker."""
    p = ctx.params
    assert p.prompts is not None and p.judge is not None
    ctx.progress.total = p.input_records
    log = CheckpointLog(
        ctx.spec.outputs["checkpoints"],
        flush_every=p.checkpoint_every,
        flush_interval_s=p.checkpoint_interval_s,
        storage_options=ctx.runtime.storage_options,
    )
    state: dict[str, SampleState] = await asyncio.to_thread(log.load)
    ctx.tally.resume.samples = sum(1 for s in state.values() if s.attempts)
    job = _InPlace(ctx, p.prompts, log, state, ctx.file(ctx.output("approved")).writer(),
                   ctx.file(ctx.output("rejected")).writer())  # fmt: skip
    window = asyncio.Semaphore(p.chunk_size)

    async def sample(record: Record) -> None:
        try:
            await job.sample(record)
        finally:
            window.release()

    flusher = asyncio.create_task(log.run_periodic_flush())
    try:
        async with job.approved_out, job.rejected_out, asyncio.TaskGroup() as group:
            async for record in aiter(ctx.read_input()):
                await window.acquire()
                group.create_task(sample(record))
    finally:
        flusher.cancel()
        await asyncio.gather(flusher, return_exceptions=True)
    ctx.tally.resume.checkpoint_segments = log.segments_written
    ctx.cleanup.append(log.clear)  # once the manifest records completion, checkpoints have served
    return ctx.counts()


@dataclass
class _InPlace:
    """One in-place job's samples: each one's attempts, checkpoints and final row. Outcomes are
    counted in place in the job's tally (no chunk's figures to add)."""

    ctx: JobContext
    prompts: PromptBuilder
    log: CheckpointLog
    state: dict[str, SampleState]
    approved_out: AsyncWriter
    rejected_out: AsyncWriter

    async def sample(self, record: Record) -> None:
        """Retry ``record`` until approved or ``max_attempts``, resuming from its checkpoint."""
        ctx, p = self.ctx, self.ctx.params
        ctx.count_ids("input", (record,))
        rid = ctx.record_id(record)
        saved = self.state.get(rid, SampleState())
        if saved.final is not None:
            await self.finish(saved.final)
            return
        before, recorded = attempts_before(record, p.round)
        attempt = max(before, saved.attempts)
        # the attempt before: the checkpoint's (a resumed sample renders the prompt it would have),
        # else the one its round's pending row records (None: a first attempt)
        previous = Previous.from_dict(saved.previous) if saved.previous else recorded
        while True:
            attempt += 1
            ctx.tally.outcomes.attempts += 1
            most, thinking = least_budget(previous, p.truncation)
            try:  # inline when quick, else in a thread: a heavy template never holds the loop
                if (clash := columns.clash(record, p.round, GENERATE)) is not None:
                    raise PromptError(clash)
                request = await self.prompts.abuild(
                    record,
                    request_id=rid,
                    attempt=attempt,
                    previous=previous,
                    least_max_tokens=most,
                    least_thinking_tokens=thinking,
                )
                if has_images(request.messages):
                    request = await asyncio.to_thread(with_images, ctx.runtime, request)
            except PromptError as exc:  # permanent: retrying cannot help
                row = _prompt_error_row(record, exc, attempt, p.round)
                await self.log.record(rid, attempt, row)
                await self.finish(row)
                return
            row, approved = await self._attempt(record, request, attempt, previous)
            if approved or attempt >= p.max_attempts:
                row["status"] = "approved" if approved else "max_attempts"
                await self.log.record(rid, attempt, row)
                await self.finish(row)
                return
            previous = previous_of(row)  # what the next attempt is told (and resumes with)
            await self.log.record(rid, attempt, previous=_checkpointed(previous, self.prompts, attempt + 1))

    async def _attempt(
        self, record: Record, request: GenerationRequest, attempt: int, previous: Previous | None
    ) -> tuple[Record, bool]:
        """Generate and judge one attempt: its row (with the judgment) and whether it was approved."""
        ctx = self.ctx
        res = (await ctx.generate([request]))[0]
        fed = fed_back(self.prompts, attempt, previous)
        row = output_row(record, **generated(res, request), attempts=attempt, round=ctx.params.round, **fed)
        ctx.tally.count_truncated([row])  # attempts cut at max_tokens (while thinking: apart too)
        ((row, verdict),) = await judge_rows(ctx, [row])
        row["judgment"] = verdict.as_dict()
        return row, verdict.approved

    async def finish(self, row: Record) -> None:
        """Count a sample's final row by its status and write it to the approved or rejected output."""
        ctx, outcomes = self.ctx, self.ctx.tally.outcomes
        status = row["status"]
        if status == "approved":
            outcomes.approved += 1
        elif status == "max_attempts":
            outcomes.max_attempts += 1
        else:  # "error": its prompt could not be built
            outcomes.error += 1
        count_adapter(ctx.tally, row, status)
        if status != "approved":
            ctx.count_rejected(row)
        ctx.count_ids("approved" if status == "approved" else "rejected", (row,))
        await (self.approved_out if status == "approved" else self.rejected_out).write(row)
        ctx.progress.done += 1


def _prompt_error_row(record: Record, exc: PromptError, attempt: int, r: int) -> Record:
    """The final row of a sample whose prompt could not be built."""
    return output_row(
        record,
        result=None,
        status="error",
        error=str(exc),
        attempts=attempt,
        round=r,
        judgment={"approved": False, "reason": "prompt_error"},
        finish_reason="error",
        max_tokens=None,
    )
