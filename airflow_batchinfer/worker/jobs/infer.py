"""The ``infer`` job (and the inference of ``infer_judge``, which then judges each chunk as the
``judge`` job does): prompts rendered, generated on the worker's shared batcher, and each record's
output row (or an OpenAI batch output line) built; the rows' generation counted
(:class:`~airflow_batchinfer.state.tally.Generated`, ``truncated``, ``truncated_in_thinking``)."""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from airflow_batchinfer.engines.base import GenerationRequest, GenerationResult, TokenLogprob
from airflow_batchinfer.engines.images import ImageError, has_images, load_images
from airflow_batchinfer.engines.pooling import GENERATE
from airflow_batchinfer.engines.reasoning import openai_message, row_fields
from airflow_batchinfer.engines.tools import calls_json
from airflow_batchinfer.judges import JudgeItem, jury
from airflow_batchinfer.judges.truncation import TruncationPolicy, decide, thinking_budget
from airflow_batchinfer.prompts.build import PromptBuilder, PromptError
from airflow_batchinfer.prompts.retries import PREVIOUS, Previous, attempts_before
from airflow_batchinfer.state.tally import Generated, Tally
from airflow_batchinfer.storage.digest import record_ids
from airflow_batchinfer.storage.fan_out import ADAPTER_FIELD
from airflow_batchinfer.storage.records import Record
from airflow_batchinfer.worker.jobs import columns
from airflow_batchinfer.worker.jobs.chunks import run_chunks
from airflow_batchinfer.worker.jobs.context import JobContext
from airflow_batchinfer.worker.jobs.judge import judge_job, to_judge
from airflow_batchinfer.worker.jobs.pooling import Pooling
from airflow_batchinfer.worker.runtime import Runtime
from airflow_batchinfer.worker.segments import ChunkFigures


def output_row(record: Mapping[str, Any], *, round: int, **fields: Any) -> Record:
    """``record`` with a new generation's ``fields`` of round ``round``: its earlier generation's are
    left out (a row has candidates and logprobs only when its own generation has; :mod:`.columns`)."""
    row = columns.base(record, round, GENERATE)
    row.update(fields, round=round)
    return row


def least_budget(previous: Previous | None, truncation: TruncationPolicy) -> tuple[int | None, int | None]:
    """The least ``max_tokens`` and thinking budget the attempt after ``previous`` runs with (the
    prompt builder's ``least_max_tokens`` and ``least_thinking_tokens``): the truncation decision on
    it (a truncated attempt's retry gets more; ``None``: a first attempt, the job's own)."""
    if previous is None:
        return None, None
    d = decide(
        previous.finish_reason,
        previous.attempt,
        previous.max_tokens,
        truncation,
        in_thinking=previous.truncated_in_thinking,
        thinking_token_budget=previous.thinking_token_budget,
    )
    return d.max_tokens, d.thinking_token_budget


def fed_back(prompts: PromptBuilder, attempt: int, previous: Previous | None) -> dict[str, Any]:
    """A row's ``previous``: what its prompt was rendered with, when the prompt read it (the review
    desk renders what the attempt was sent with from it); ``{}`` otherwise."""
    if previous is None or not prompts.shows_previous(attempt):
        return {}
    return {PREVIOUS: previous.stored()}


def generated(res: GenerationResult, request: GenerationRequest | None) -> dict[str, Any]:
    """A row's fields of the generation ``res`` of ``request`` (``None``: none was built): ``result``,
    ``status``, ``error``, ``finish_reason``, ``max_tokens``; ``adapter``, the LoRA adapter's name,
    when one answered; ``logprobs`` (OpenAI's
    ``logprobs.content``) when asked for; a reasoning model's ``reasoning``, ``reasoning_tokens`` and
    ``truncated_in_thinking`` (:func:`~airflow_batchinfer.engines.reasoning.row_fields`: ``result`` is
    the answer alone); ``tool_calls`` (OpenAI's list, :mod:`~airflow_batchinfer.engines.tools`) when
    the answer made calls; with ``n`` > 1 every candidate in ``candidates`` (``index``, ``result``,
    ``finish_reason``, ``completion_tokens``, ``logprobs``, its reasoning, ``tool_calls``),
    which the judge step judges one by one (:mod:`~airflow_batchinfer.judges.candidates`)."""
    fields: dict[str, Any] = {
        "result": res.text,
        "status": "ok" if res.ok else "error",
        "error": res.error,
        "finish_reason": res.finish_reason,
        "max_tokens": request.sampling.max_tokens if request is not None else None,
    }
    if request is not None and request.adapter is not None:  # the judge step counts rows by it
        fields[ADAPTER_FIELD] = request.adapter.name
    if request is not None and (budget := thinking_budget(request.sampling)) is not None:
        fields["thinking_token_budget"] = budget  # what a retry cut in thinking raises (judges.truncation)
    if res.logprobs is not None:
        fields["logprobs"] = [t.as_json() for t in res.logprobs]
    fields.update(row_fields(res.reasoning, res.reasoning_tokens, res.reasoning_ended, res.finish_reason))
    if res.tool_calls:
        fields["tool_calls"] = calls_json(res.tool_calls)
    if res.choices:  # n > 1 (n = 1: the result is its one candidate)
        fields["candidates"] = [
            {
                "index": i,
                "result": c.text,
                "finish_reason": c.finish_reason,
                "completion_tokens": c.completion_tokens,
                **({"logprobs": [t.as_json() for t in c.logprobs]} if c.logprobs is not None else {}),
                **row_fields(c.reasoning, c.reasoning_tokens, c.reasoning_ended, c.finish_reason),
                **({"tool_calls": calls_json(c.tool_calls)} if c.tool_calls else {}),
            }
            for i, c in enumerate(res.choices)
        ]
    return fields


def with_images(runtime: Runtime, request: GenerationRequest) -> GenerationRequest:
    """``request`` with its image parts loaded (read here, in the job's context: under its storage
    policy; file reads, so off the event loop), or a :class:`PromptError` saying why one cannot be."""
    try:
        return load_images(request, runtime.image_limits, runtime.storage_options)
    except ImageError as exc:
        raise PromptError(f"record {request.request_id!r}: {exc}") from None


# ------------------------------------------------------------------------------------------ infer
Built = list[tuple[Record, GenerationRequest | str]]  # each record with its request or prompt error
IMAGE_READERS = 8  # a chunk's requests whose images are read at once (storage latency bounds them)


def load_chunk_images(runtime: Runtime, built: Built) -> Built:
    """``built`` with each request's images loaded (:func:`with_images`; a record whose image cannot
    be loaded gets that as its error), up to :data:`IMAGE_READERS` requests at once, in order. Each
    read runs in a copy of this thread's context: under the job's storage policy."""
    todo = {
        i: r for i, (_, r) in enumerate(built) if isinstance(r, GenerationRequest) and has_images(r.messages)
    }

    def load(request: GenerationRequest) -> GenerationRequest | str:
        try:
            return with_images(runtime, request)
        except PromptError as exc:
            return str(exc)

    out = list(built)
    if not todo:
        return out
    contexts = [contextvars.copy_context() for _ in todo]  # a context runs in one thread at a time
    with ThreadPoolExecutor(min(IMAGE_READERS, len(todo)), thread_name_prefix="images") as pool:
        loaded = pool.map(lambda r, ctx: ctx.run(load, r), todo.values(), contexts)
        for i, request in zip(todo, loaded, strict=True):
            out[i] = (built[i][0], request)
    return out


class Inference:
    """Generation for one job's chunks (``infer`` and ``infer_judge``). The event loop only feeds
    the batcher: rendering a chunk's prompts (and estimating their tokens) and building its rows are
    CPU work for a thread, one hop each per chunk; the rows' encoding and compression happen in the
    writer's thread."""

    def __init__(self, ctx: JobContext) -> None:
        assert ctx.params.prompts is not None
        self.ctx, self.prompts = ctx, ctx.params.prompts
        self.created = int(time.time())
        described = ctx.runtime.describe()
        self.model = str(described.get("model", described.get("engine")))

    def build(self, chunk: list[Record]) -> tuple[Built, list[GenerationRequest], list[float]]:
        built: Built = []
        truncation = self.ctx.params.truncation
        for record in chunk:
            before, previous = attempts_before(record, self.ctx.params.round)
            most, thinking = least_budget(previous, truncation)
            if (clash := columns.clash(record, self.ctx.params.round, GENERATE)) is not None:
                built.append((record, clash))
                continue
            try:
                rid = self.ctx.record_id(record)
                request = self.prompts.build(
                    record,
                    request_id=rid,
                    attempt=before + 1,
                    previous=previous,
                    least_max_tokens=most,
                    least_thinking_tokens=thinking,
                )
                built.append((record, request))
            except PromptError as exc:
                built.append((record, str(exc)))
        built = load_chunk_images(self.ctx.runtime, built)
        requests = [r for _, r in built if isinstance(r, GenerationRequest)]
        return built, requests, self.ctx.runtime.estimate(requests)

    def rows(self, built: Built, results: list[GenerationResult]) -> tuple[list[Record], Generated]:
        p = self.ctx.params
        counts = Generated()
        rows = []
        it = iter(results)
        for record, req in built:
            res = next(it) if isinstance(req, GenerationRequest) else GenerationResult.failed(req)
            if res.ok:
                counts.ok += 1
            else:
                counts.error += 1
            if p.output_format == "openai":
                rows.append(openai_batch_row(record, res, model=self.model, created=self.created))
            else:
                request = req if isinstance(req, GenerationRequest) else None
                before, previous = attempts_before(record, p.round)
                fed = fed_back(self.prompts, before + 1, previous)
                rows.append(
                    output_row(record, **generated(res, request), attempts=before + 1, round=p.round, **fed)
                )
        return rows, counts

    async def __call__(self, chunk: list[Record], figures: ChunkFigures) -> list[Record]:
        """One output row per record of ``chunk``, in order (counted into ``figures``)."""
        built, requests, costs = await asyncio.to_thread(self.build, chunk)
        results = await self.ctx.generate(requests, costs, chunk=figures)
        rows, generated = await asyncio.to_thread(self.rows, built, results)
        figures.tally.generated += generated
        if self.ctx.params.early_jury is not None:
            await _judge_early(self.ctx, self.ctx.params.early_jury, rows, figures)
        return rows


async def _judge_early(ctx: JobContext, early: jury.Jury, rows: list[Record], figures: ChunkFigures) -> None:
    """The verdicts of ``early``'s members judged where the answers are generated (its llm members,
    beside a model judge on the judge pool), carried in each answer (the row, or its candidate) to
    the judge job: every answer the judge step will judge (:func:`~.judge.to_judge`)."""
    items, where = [], []
    for row in rows:
        for answer, todo in to_judge(ctx, row):
            if isinstance(todo, JudgeItem):
                items.append(todo)
                where.append(answer)
    if not items:
        return

    async def generate(requests: list[GenerationRequest]) -> list[GenerationResult]:
        return await ctx.generate(requests, chunk=figures)

    for answer, found in zip(where, await early.judge_early(items, generate), strict=True):
        answer[jury.CARRIED] = found


def inference(ctx: JobContext) -> Inference | Pooling:
    """What makes a chunk's rows: generation, or the job's pooling task (:mod:`.pooling`)."""
    return Inference(ctx) if ctx.params.task == GENERATE else Pooling(ctx)


async def run_infer(ctx: JobContext) -> Tally:
    ctx.progress.total = ctx.params.input_records
    infer = inference(ctx)

    async def process(chunk: list[Record], figures: ChunkFigures) -> list[Record]:
        rows = await infer(chunk, figures)
        figures.count_ids("inferred", record_ids(chunk, ctx.params.id_field))  # one row per record, its id
        # (a judge counts its own)
        figures.tally.count_truncated(rows)
        return rows

    await run_chunks(ctx, process, lambda rows: {"inferred": rows})
    return ctx.counts()


async def run_infer_judge(ctx: JobContext) -> Tally:
    """Infer and judge in one pass: a rule judge, or an LLM judge served by this worker's engine."""
    return await judge_job(ctx, inference(ctx))


def openai_batch_row(record: Mapping[str, Any], res: GenerationResult, *, model: str, created: int) -> Record:
    """One line of an OpenAI batch output file: ``{id, custom_id, response, error}``, its body a chat
    completion (``choices[*]``: ``index``, ``message``, ``logprobs``, ``finish_reason``) or a text
    completion (``text`` for ``message``) with ``usage``, as OpenAI's are: a choice per candidate
    (``n``), ``logprobs`` in the chat form (``{"content": [...]}``) or the completions form
    (``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``), ``null`` when not asked for;
    a reasoning model's reasoning in the message as vLLM's server writes it
    (:func:`~airflow_batchinfer.engines.reasoning.openai_message`) and its tokens in
    ``usage.completion_tokens_details.reasoning_tokens``; a message with calls has ``tool_calls``
    (none: no such key, as vLLM's server writes it) and ``content`` ``null`` when it says nothing
    besides them."""
    custom_id = record.get("custom_id", record.get("id"))
    digest = hashlib.sha256(f"{custom_id}".encode()).hexdigest()[:24]
    if not res.ok:
        return {
            "id": f"batch_req_{digest}",
            "custom_id": custom_id,
            "response": None,
            "error": {"code": "inference_error", "message": res.error},
        }
    raw_body = record.get("body")
    body: dict[str, Any] = raw_body if isinstance(raw_body, dict) else {}
    usage: dict[str, Any] = {
        "prompt_tokens": res.prompt_tokens,
        "completion_tokens": res.completion_tokens,
        "total_tokens": res.prompt_tokens + res.completion_tokens,
    }
    chat = "messages" in body or "body" not in record
    reasoned = [c for c in res.candidates if c.reasoning is not None]
    if chat and reasoned:  # vLLM's server says so with a reasoning parser
        usage["completion_tokens_details"] = {"reasoning_tokens": sum(c.reasoning_tokens for c in reasoned)}
    choices: list[dict[str, Any]] = []
    for i, c in enumerate(res.candidates):
        if chat:
            logprobs = None if c.logprobs is None else {"content": [t.as_json() for t in c.logprobs]}
            message = openai_message("assistant", c.text, c.reasoning)
            if c.tool_calls:
                message["content"] = c.text or None
                message["tool_calls"] = calls_json(c.tool_calls)
            answer: dict[str, Any] = {"message": message}
        else:
            logprobs = None if c.logprobs is None else _completion_logprobs(c.logprobs)
            answer = {"text": c.text}
        choices.append({"index": i, **answer, "logprobs": logprobs, "finish_reason": c.finish_reason})
    response_body: dict[str, Any] = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{digest}",
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": body.get("model", model),
        "choices": choices,
        "usage": usage,
        "system_fingerprint": None,
    }
    return {
        "id": f"batch_req_{digest}",
        "custom_id": custom_id,
        "response": {"status_code": 200, "request_id": f"req_{digest}", "body": response_body},
        "error": None,
    }


def _completion_logprobs(tokens: Iterable[TokenLogprob]) -> dict[str, Any]:
    """The completions API's ``logprobs``: parallel lists, ``top_logprobs`` a ``{token: logprob}`` each."""
    tokens = list(tokens)
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t.token)
    return {
        "tokens": [t.token for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [dict(t.top) for t in tokens],
        "text_offset": offsets,
    }
