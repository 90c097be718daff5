"""The shard jobs a worker runs: ``infer``, ``judge``, ``infer_judge`` (both in one pass over the
shard) and ``in_place``.

Each streams its input shard in chunks (memory is bounded by ``concurrency × chunk_size`` records
per worker, whatever the shard size), submits prompts to the worker's shared batcher, turns every
per-record failure into a row with a reason, and commits each output file atomically. Output rows
are the input record plus ``result``, ``status``, ``error``, ``judgment``, ``attempts`` and ``round``.

Fencing: a spec with ``outputs["staging"]`` has its outputs (a judge's or in-place job's approved
and rejected rows, an infer job's inferred rows) written under a fresh attempt token
(:meth:`JobContext.output`), never to their final URIs; the completion manifest names the attempt
and its files (``committed``), a judge reads the infer attempt named there, and the round's close
accepts one attempt of each job.

Accounting: next to its counts, a job digests the ids it reads (``input``) and those of every row
it emits per output file (:data:`~airflow_batchinfer.state.docs.ID_OUTPUTS`); the manifest's
``ids`` carries them, and the round's close checks the invariant from them without reading rows.
Judge, infer_judge and in-place jobs also count the reason groups of the rows they reject
(:func:`~airflow_batchinfer.judges.reasons.reason_group`), the manifest's ``reason_groups``: the review
page shows a round's groups from them without reading its rows.

Resume inside a shard: an infer, judge or infer_judge spec with ``outputs["segments"]`` commits each
chunk as a segment (:mod:`~airflow_batchinfer.worker.segments`) and assembles its outputs from them
at the end; a later attempt of the job continues after the last committed segment. Without it a job
streams one file per output, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from airflow_batchinfer.engines.adapters import row_count_key
from airflow_batchinfer.engines.base import GenerationRequest, GenerationResult, TokenLogprob
from airflow_batchinfer.engines.scoring import ScoreRequest, ScoreResult
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges import RAW_SCORES, JudgeItem, Verdict, candidates, jury, spot_check
from airflow_batchinfer.judges.base import Scorer
from airflow_batchinfer.judges.human import HumanJudge
from airflow_batchinfer.judges.reasons import ReasonGroups, row_reason
from airflow_batchinfer.judges.truncation import LENGTH, TruncationPolicy, decide, row_decision
from airflow_batchinfer.prompts.build import PromptBuilder, PromptError
from airflow_batchinfer.prompts.retries import PREVIOUS, Previous, previous_of
from airflow_batchinfer.rpc.fingerprint import fingerprint
from airflow_batchinfer.rpc.models import JobSpec, Progress
from airflow_batchinfer.state.docs import ID_OUTPUTS, Digest
from airflow_batchinfer.state.layout import fenced_outputs, staged_output
from airflow_batchinfer.state.params import JobParams
from airflow_batchinfer.storage import JsonlFile
from airflow_batchinfer.storage.digest import IdDigest, record_ids
from airflow_batchinfer.storage.fan_out import ADAPTER_FIELD
from airflow_batchinfer.storage.id_hashes import HashWriter, hashes_beside
from airflow_batchinfer.storage.ranges import InputRange, RangeRecordReader, read_stats
from airflow_batchinfer.storage.reader import RecordReader
from airflow_batchinfer.storage.records import Record
from airflow_batchinfer.storage.writer import in_thread
from airflow_batchinfer.worker.checkpoints import CheckpointLog, SampleState
from airflow_batchinfer.worker.runtime import Runtime
from airflow_batchinfer.worker.segments import JobKey, SegmentDoc, SegmentLog, Tally

log = logging.getLogger("airflow_batchinfer.worker")


@dataclass
class JobContext:
    spec: JobSpec
    params: JobParams
    runtime: Runtime
    progress: Progress = field(default_factory=Progress)
    counts: Counter[str] = field(default_factory=Counter)
    tokens: Counter[str] = field(default_factory=Counter)
    # Run after the completion manifest is written (e.g. deleting checkpoints that served).
    cleanup: list[Callable[[], None]] = field(default_factory=list)
    # This attempt's token: a fresh one each time the worker starts the job, so two copies of one job
    # (an Airflow retry while the first still runs elsewhere) never write the same staged files.
    attempt: str = field(default_factory=lambda: uuid.uuid4().hex)
    # Fenced outputs as written by this attempt: name -> staged URI (recorded in the manifest).
    committed: dict[str, str] = field(default_factory=dict)
    # "input" and each output name -> the count and digest of its ids (the manifest's ``ids``).
    ids: dict[str, IdDigest] = field(default_factory=dict)
    # The reason groups of the rows this job rejected (the manifest's ``reason_groups``).
    reason_groups: ReasonGroups = field(default_factory=ReasonGroups)

    def count_rejected(self, row: Mapping[str, Any]) -> None:
        """Count a rejected (or, in place, exhausted) row's reason group."""
        self.reason_groups.add(row_reason(row))

    def count_ids(self, name: str, records: Iterable[Mapping[str, Any]]) -> None:
        """Add the ids of ``records`` (read, or emitted into output ``name``) to that digest."""
        digest = self.ids.get(name)
        if digest is None:
            digest = self.ids[name] = IdDigest()
        digest.add_many(record_ids(records, self.params.id_field))

    def absorb(self, tally: Tally) -> None:
        """Add one chunk's figures (counted while it was processed, or read from its segment) to the job's."""
        self.counts.update(tally.counts)
        self.tokens.update(tally.tokens)
        self.reason_groups.merge(tally.reason_groups)
        for name, digest in tally.ids.items():
            self.ids[name] = self.ids.get(name, IdDigest()) + digest

    def ids_doc(self) -> dict[str, Digest]:
        """The manifest's ``ids``: ``input`` and every output of the kind, empty ones included."""
        names = ("input", *ID_OUTPUTS.get(self.spec.kind, ()))
        return {n: Digest.of(self.ids.get(n, IdDigest())) for n in dict.fromkeys([*names, *self.ids])}

    def file(self, uri: str) -> JsonlFile:
        return JsonlFile(uri, storage_options=self.runtime.storage_options)

    def read_input(self) -> RecordReader:
        """The job's input records, for every job kind. A round-0 range shard (``params.input_range``:
        a byte range of the input file, nothing copied) is validated line by line exactly as sharding
        validates (:class:`~airflow_batchinfer.storage.ranges.RangeRecordReader`): bad lines go to
        ``outputs["input_rejects"]`` with their line in the range and byte offset, and the read's
        line counts join the job's counts as ``read_lines``, ``read_records``, ``read_blank``,
        ``read_skipped`` and ``read_quarantined`` (round 0's close turns them into the run's
        ``rejects/`` with absolute line numbers). Once the range is read to its end, its id hash
        file (:class:`~airflow_batchinfer.storage.id_hashes.HashWriter`: each kept id's hash and
        line in the range) is written beside the manifest, before it."""
        raw = self.params.raw.get("input_range")
        if raw is None:
            return self.file(self.spec.input).iter_records()
        rng = InputRange.from_params(raw)
        rejects_uri = self.spec.outputs.get("input_rejects")
        if rejects_uri is None:
            raise ConfigError(
                f"shard {rng.shard_id}: a range job needs outputs['input_rejects'] (where its bad lines go)"
            )
        rejects = self.file(rejects_uri).writer_sync()
        # Beside the manifest, written before it: round 0's close finds ids two ranges hold from these.
        hashes = HashWriter(
            hashes_beside(self.spec.outputs["manifest"], rng.shard_id), self.runtime.storage_options
        )
        reader: RangeRecordReader

        def finish(ok: bool) -> None:
            if not ok:
                rejects.abort()
                hashes.abort()
                return
            rejects.commit()
            hashes.commit(reader.stats.lines)
            self.counts.update(read_stats(reader.policy))

        reader = RangeRecordReader(
            self.file(self.spec.input), rng, rejects=rejects, finish=finish, keep=hashes.add
        )
        return reader

    def output(self, name: str) -> str:
        """Where this attempt writes output ``name``. With ``outputs["staging"]`` the fenced outputs
        (approved, rejected; an infer job's inferred) go to ``<staging>/<job>/<attempt>/<name>.jsonl.zst``,
        and the round's close moves one attempt's files to their final URIs (``outputs[name]``);
        without it, straight there."""
        outputs = self.spec.outputs
        staging = outputs.get("staging")
        if not staging or name not in fenced_outputs(self.spec.kind):
            return outputs[name]
        uri = staged_output(staging, outputs["manifest"], self.attempt, name)
        self.committed[name] = uri
        return uri

    async def generate(
        self,
        requests: list[GenerationRequest],
        costs: list[float] | None = None,
        *,
        tally: Tally | None = None,
    ) -> list[GenerationResult]:
        """The worker's shared batcher, with this job's token usage counted (``costs``: the
        requests' :meth:`Runtime.estimate`, if known), into ``tally`` when given (a chunk's)."""
        results = await self.runtime.generate(requests, costs)
        tokens = self.tokens if tally is None else tally.tokens
        for r in results:
            tokens["prompt"] += r.prompt_tokens
            tokens["completion"] += r.completion_tokens
        return results

    async def score(self, requests: list[ScoreRequest], *, tally: Tally | None = None) -> list[ScoreResult]:
        """The worker's shared batcher for a scoring model, this job's tokens counted as in
        :meth:`generate` (a scored text's are all prompt tokens)."""
        results = await self.runtime.score(requests)
        tokens = self.tokens if tally is None else tally.tokens
        tokens["prompt"] += sum(r.prompt_tokens for r in results)
        return results

    def scorer(self, tally: Tally | None = None) -> Scorer | None:
        """The worker's scoring model for this job's judge (``None``: the worker generates)."""
        model = self.runtime.engine.scoring
        if model is None:
            return None

        async def score(requests: list[ScoreRequest]) -> list[ScoreResult]:
            return await self.score(requests, tally=tally)

        return Scorer(model, score, self.params.conversation)

    def record_id(self, record: Mapping[str, Any]) -> str:
        rid = record.get(self.params.id_field, record.get("custom_id"))
        return str(rid)


def output_row(record: Mapping[str, Any], **fields: Any) -> Record:
    """``record`` with a new generation's ``fields``: its earlier generation's are left out (a row
    has candidates and logprobs only when its own generation has)."""
    row = {k: v for k, v in record.items() if k not in candidates.GENERATION_FIELDS}
    row.update(fields)
    return row


def least_max_tokens(previous: Previous | None, truncation: TruncationPolicy) -> int | None:
    """The least ``max_tokens`` the attempt after ``previous`` runs with: the truncation decision on
    it (a truncated attempt's retry gets more; ``None``: a first attempt, the job's own)."""
    if previous is None:
        return None
    return decide(previous.finish_reason, previous.attempt, previous.max_tokens, truncation).max_tokens


def _checkpointed(previous: Previous | None, prompts: PromptBuilder, attempt: int) -> dict[str, Any] | None:
    """What an in-place checkpoint keeps of ``previous`` for attempt ``attempt``: all of it when that
    attempt's prompt reads it, else what its ``max_tokens`` is decided from (the answer and reason
    left out: a checkpoint stays small whatever the answers' length)."""
    if previous is None:
        return None
    if not prompts.shows_previous(attempt):
        previous = replace(previous, result=None, reason=None, score=None, note=None)
    return previous.as_dict()


def fed_back(prompts: PromptBuilder, attempt: int, previous: Previous | None) -> dict[str, Any]:
    """A row's ``previous``: what its prompt was rendered with, when the prompt read it (the review
    desk renders what the attempt was sent with from it); ``{}`` otherwise."""
    if previous is None or not prompts.shows_previous(attempt):
        return {}
    return {PREVIOUS: previous.as_dict()}


def generated(res: GenerationResult, request: GenerationRequest | None) -> dict[str, Any]:
    """A row's fields of the generation ``res`` of ``request`` (``None``: none was built): ``result``,
    ``status``, ``error``, ``finish_reason``, ``max_tokens``; ``adapter``, the LoRA adapter's name,
    when one answered; ``logprobs`` (OpenAI's
    ``logprobs.content``) when asked for; with ``n`` > 1 every candidate in ``candidates``
    (``index``, ``result``, ``finish_reason``, ``completion_tokens``, ``logprobs``), which the judge
    step judges one by one (:mod:`~airflow_batchinfer.judges.candidates`)."""
    fields: dict[str, Any] = {
        "result": res.text,
        "status": "ok" if res.ok else "error",
        "error": res.error,
        "finish_reason": res.finish_reason,
        "max_tokens": request.sampling.max_tokens if request is not None else None,
    }
    if request is not None and request.adapter is not None:  # the judge step counts rows by it
        fields[ADAPTER_FIELD] = request.adapter.name
    if res.logprobs is not None:
        fields["logprobs"] = [t.as_json() for t in res.logprobs]
    if res.choices:  # n > 1 (n = 1: the result is its one candidate)
        fields["candidates"] = [
            {
                "index": i,
                "result": c.text,
                "finish_reason": c.finish_reason,
                "completion_tokens": c.completion_tokens,
                **({"logprobs": [t.as_json() for t in c.logprobs]} if c.logprobs is not None else {}),
            }
            for i, c in enumerate(res.choices)
        ]
    return fields


FIRST_CHUNK = 256  # records in a job's first chunk: enough for an engine batch to start on

# ------------------------------------------------------------------------------------------ infer
Built = list[tuple[Record, GenerationRequest | str]]  # each record with its request or prompt error


class _Inference:
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
            attempts = int(record.get("attempts") or 0) + 1
            previous = previous_of(record)  # a round's pending row: the attempt it records
            try:
                rid = self.ctx.record_id(record)
                request = self.prompts.build(
                    record,
                    request_id=rid,
                    attempt=attempts,
                    previous=previous,
                    least_max_tokens=least_max_tokens(previous, truncation),
                )
                built.append((record, request))
            except PromptError as exc:
                built.append((record, str(exc)))
        requests = [r for _, r in built if isinstance(r, GenerationRequest)]
        return built, requests, self.ctx.runtime.estimate(requests)

    def rows(self, built: Built, results: list[GenerationResult]) -> tuple[list[Record], Counter[str]]:
        p = self.ctx.params
        counts: Counter[str] = Counter()
        rows = []
        it = iter(results)
        for record, req in built:
            res = next(it) if isinstance(req, GenerationRequest) else GenerationResult.failed(req)
            counts["ok" if res.ok else "error"] += 1
            if p.output_format == "openai":
                rows.append(openai_batch_row(record, res, model=self.model, created=self.created))
            else:
                request = req if isinstance(req, GenerationRequest) else None
                attempts = int(record.get("attempts") or 0) + 1
                fed = fed_back(self.prompts, attempts, previous_of(record))
                rows.append(
                    output_row(record, **generated(res, request), attempts=attempts, round=p.round, **fed)
                )
        return rows, counts

    async def __call__(self, chunk: list[Record], tally: Tally) -> list[Record]:
        """One output row per record of ``chunk``, in order (counted into ``tally``)."""
        built, requests, costs = await asyncio.to_thread(self.build, chunk)
        results = await self.ctx.generate(requests, costs, tally=tally)
        rows, counts = await asyncio.to_thread(self.rows, built, results)
        tally.counts.update(counts)
        if self.ctx.params.early_jury is not None:
            await _judge_early(self.ctx, self.ctx.params.early_jury, rows, tally)
        return rows


async def _judge_early(ctx: JobContext, early: jury.Jury, rows: list[Record], tally: Tally) -> None:
    """The verdicts of ``early``'s members judged where the answers are generated (its llm members,
    beside a model judge on the judge pool), carried in each answer (the row, or its candidate) to
    the judge job: every answer the judge step will judge (:func:`_to_judge`)."""
    items, where = [], []
    for row in rows:
        for answer, todo in _to_judge(ctx, row):
            if isinstance(todo, JudgeItem):
                items.append(todo)
                where.append(answer)
    if not items:
        return

    async def generate(requests: list[GenerationRequest]) -> list[GenerationResult]:
        return await ctx.generate(requests, tally=tally)

    for answer, found in zip(where, await early.judge_early(items, generate), strict=True):
        answer[jury.CARRIED] = found


async def run_infer(ctx: JobContext) -> dict[str, int]:
    ctx.progress.total = ctx.params.input_records
    infer = _Inference(ctx)

    async def process(chunk: list[Record], tally: Tally) -> list[Record]:
        rows = await infer(chunk, tally)
        tally.count_ids("inferred", record_ids(chunk, ctx.params.id_field))  # one row per record, its id
        if truncated := sum(r.get("finish_reason") == LENGTH for r in rows):  # (a judge counts its own)
            tally.counts["truncated"] += truncated
        return rows

    await _run_chunks(ctx, process, lambda rows: {"inferred": rows})
    return dict(ctx.counts)


Process = Callable[[list[Record], Tally], Coroutine[Any, Any, list[Record]]]
Split = Callable[[list[Record]], dict[str, list[Record]]]  # a chunk's rows per output name
# What happens to a processed chunk, in chunk order: (index, input records, rows, its tally).
Write = Callable[[int, int, list[Record], Tally], Awaitable[None]]
Resumed = Callable[[int, list[Record]], Awaitable[bool]]


@dataclass
class _Chunk:
    index: int
    records: int
    rows: list[Record]
    tally: Tally


async def _run_chunks(ctx: JobContext, process: Process, split: Split) -> None:
    """Every chunk of the input through ``process``, its rows into the kind's outputs (``split``):
    streamed into one writer per output, or, with ``outputs["segments"]``, committed chunk by chunk
    as segments and assembled at the end (:func:`_run_segmented`)."""
    if ctx.spec.outputs.get("segments"):
        await _run_segmented(ctx, process, split)
        return
    names = ID_OUTPUTS[ctx.spec.kind]
    async with contextlib.AsyncExitStack() as stack:  # an exception aborts every writer
        writers = {n: await stack.enter_async_context(ctx.file(ctx.output(n)).writer()) for n in names}

        async def write(index: int, records: int, rows: list[Record], tally: Tally) -> None:
            for name, part in split(rows).items():
                await writers[name].write_many(part)

        await _pipelined(ctx, process, write)


async def _run_segmented(ctx: JobContext, process: Process, split: Split) -> None:
    """The job through its segment log, marked live there while it runs."""
    spec, p = ctx.spec, ctx.params
    info = await asyncio.to_thread(ctx.file(spec.input).info)
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
            ctx.absorb(Tally.of(doc))
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

    async def write(index: int, records: int, rows: list[Record], tally: Tally) -> None:
        chosen.append(await in_thread(segments.commit, index, records, rows, split, tally))

    await _pipelined(ctx, process, write, resumed)
    for name, target in targets.items():
        await in_thread(segments.assemble, chosen, name, target)
    ctx.progress.done = sum(d.records for d in chosen)
    ctx.counts["resumed_records"] = sum(d.records for d in chosen if d.attempt != ctx.attempt)
    ctx.counts["segments"] = segments.committed


async def _pipelined(ctx: JobContext, process: Process, write: Write, resumed: Resumed | None = None) -> None:
    """Process chunk k+1 while chunk k is written: the batcher never waits on this job's I/O.
    At most two chunks are in memory per job (and one being read). Each chunk is read, decoded and
    parsed in a thread, in one hop; the first is small, so the engine starts on it at once. A
    chunk ``resumed`` says is done already is read (and checked there), not processed."""
    reader = ctx.read_input()
    pending: asyncio.Task[_Chunk] | None = None
    size = ctx.params.chunk_size

    async def run(index: int, chunk: list[Record]) -> _Chunk:
        tally = Tally()
        tally.count_ids("input", record_ids(chunk, ctx.params.id_field))
        return _Chunk(index, len(chunk), await process(chunk, tally), tally)

    async def finish(task: asyncio.Task[_Chunk]) -> None:
        done = await task
        await write(done.index, done.records, done.rows, done.tally)
        ctx.absorb(done.tally)  # the job's figures hold what is written
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


def openai_batch_row(record: Mapping[str, Any], res: GenerationResult, *, model: str, created: int) -> Record:
    """One line of an OpenAI batch output file: ``{id, custom_id, response, error}``, its body a chat
    completion (``choices[*]``: ``index``, ``message``, ``logprobs``, ``finish_reason``) or a text
    completion (``text`` for ``message``) with ``usage``, as OpenAI's are: a choice per candidate
    (``n``), ``logprobs`` in the chat form (``{"content": [...]}``) or the completions form
    (``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``), ``null`` when not asked for."""
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
    usage = {
        "prompt_tokens": res.prompt_tokens,
        "completion_tokens": res.completion_tokens,
        "total_tokens": res.prompt_tokens + res.completion_tokens,
    }
    chat = "messages" in body or "body" not in record
    choices: list[dict[str, Any]] = []
    for i, c in enumerate(res.candidates):
        if chat:
            logprobs = None if c.logprobs is None else {"content": [t.as_json() for t in c.logprobs]}
            answer: dict[str, Any] = {"message": {"role": "assistant", "content": c.text}}
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


# ------------------------------------------------------------------------------------------ judge
def _candidates(row: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """What the judge judges of ``row``: the candidates its generation wrote (``n`` > 1), else its
    one ``result``."""
    return candidates.of(row) or [row]


def _to_judge(ctx: JobContext, row: Record) -> list[tuple[Any, JudgeItem | Verdict]]:
    """Each answer of ``row`` (a candidate, or the row itself) and what the judge step makes of it
    before any judge: the item to judge, or its rejection. An errored inference is one rejection; a
    truncated answer is rejected unless ``truncated: judge``
    (:mod:`~airflow_batchinfer.judges.truncation`)."""
    if row.get("status") == "error" or row.get("result") is None:
        return [(row, Verdict(False, f"inference_error: {row.get('error')}"))]
    out: list[tuple[Any, JudgeItem | Verdict]] = []
    attempt = int(row.get("attempts") or 1)
    for c, candidate in enumerate(_candidates(row)):
        probe = row if candidate is row else {**row, "finish_reason": candidate.get("finish_reason")}
        truncation = row_decision(probe, ctx.params.truncation)
        if truncation.reject:  # half an answer: not worth the judge's tokens
            out.append((candidate, Verdict(False, truncation.reason or "truncated")))
        else:
            item = JudgeItem(row, str(candidate["result"]), ctx.record_id(row), attempt, candidate=c)
            out.append((candidate, item))
    return out


async def _judge_rows(
    ctx: JobContext, rows: list[Record], tally: Tally | None = None
) -> list[tuple[Record, Verdict]]:
    """Verdicts for inferred rows; an errored inference is a rejection without asking the judge, and
    so is a truncated one unless ``truncated: judge`` (:mod:`~airflow_batchinfer.judges.truncation`).
    A row with candidates has each judged and comes back as the run's ``select`` chose
    (:func:`_selected`), its verdict the chosen candidate's, the candidates counted. A judge's tokens
    and those counts go to ``tally`` when given (a chunk's), else to the job's."""
    p = ctx.params
    assert p.judge is not None
    verdicts: list[list[Verdict | None]] = []
    items, positions = [], []
    for i, row in enumerate(rows):
        mine: list[Verdict | None] = []
        for c, (_, todo) in enumerate(_to_judge(ctx, row)):
            if isinstance(todo, Verdict):
                mine.append(todo)
                continue
            mine.append(None)
            items.append(todo)
            positions.append((i, c))
        verdicts.append(mine)
    if items:

        async def generate(requests: list[GenerationRequest]) -> list[GenerationResult]:
            return await ctx.generate(requests, tally=tally)

        judged = await p.judge.judge(items, generate, ctx.scorer(tally))
        for (i, c), verdict in zip(positions, judged, strict=True):
            verdicts[i][c] = verdict
    out = []
    counts = ctx.counts if tally is None else tally.counts
    people = isinstance(p.judge, HumanJudge)  # every verdict awaits a person: no candidate is approved yet
    for row, found in zip(rows, verdicts, strict=True):
        vs = [v if v is not None else Verdict(False, "invalid_judgment") for v in found]
        if len(vs) < 2:
            out.append((_without_carried(row), vs[0]))
            counts.update(jury.count_keys(vs[0]))
            continue
        cut = [c.get("finish_reason") == LENGTH for c in _candidates(row)]
        selection = candidates.select(vs, p.select, review_below=p.review_below, truncated=cut)
        if not people:
            counts.update(candidates.counts(len(vs), selection))
        counts.update(jury.count_keys(vs[selection.chosen]))  # the answer the row keeps
        out.append((_selected(row, vs, selection, p.select), vs[selection.chosen]))
    return out


def _without_carried(row: Record) -> Record:
    """``row`` without the jury verdicts its inference carried (its judgment's ``members`` hold them)."""
    if jury.CARRIED not in row:
        return row
    return {k: v for k, v in row.items() if k != jury.CARRIED}


def _selected(row: Record, verdicts: list[Verdict], selection: candidates.Selection, how: str) -> Record:
    """``row`` as ``selection`` chose: the chosen candidate's ``result``, ``finish_reason`` (and
    ``logprobs``), its index as ``candidate``; ``candidates``, each with its ``judgment``: the kept
    ones when approved with ``select: all``, none when approved otherwise, all when rejected."""
    judged = [
        {**{k: x for k, x in c.items() if k != jury.CARRIED}, "judgment": v.as_dict()}
        for c, v in zip(_candidates(row), verdicts, strict=True)
    ]
    chosen = judged[selection.chosen]
    out = {**_without_carried(row), "result": chosen["result"], "finish_reason": chosen.get("finish_reason")}
    out["candidate"] = selection.chosen
    if "logprobs" in chosen:
        out["logprobs"] = chosen["logprobs"]
    if not selection.ok:
        out["candidates"] = judged
    elif how == "all":
        out["candidates"] = [judged[i] for i in selection.kept]
    else:
        del out["candidates"]
    return out


def _for_review(ctx: JobContext, verdict: Verdict) -> bool:
    """Whether people judge this sample: a human judge's, or a verdict scored below the run's
    ``review_below_score`` (or not scored at all: the judge's answer could not be read)."""
    if isinstance(ctx.params.judge, HumanJudge):
        return True
    below = ctx.params.review_below
    return below is not None and (verdict.score is None or verdict.score < below)


def _count_adapter(
    counts: Counter[str], row: Mapping[str, Any], status: str, judgment: Mapping[str, Any] | None = None
) -> None:
    """A judged row's count under the LoRA adapter that answered it (the round's approval per
    adapter): a spot check (``judgment``'s) apart, neither approved nor rejected. A row without an
    answer (an inference error, a record naming no adapter of the run: its name is the record's, not
    the run's) is the round's inference errors."""
    held = judgment is not None and spot_check.is_spot_check(judgment)
    key = row_count_key(row.get(ADAPTER_FIELD), row.get("status") != "error", status, held)
    if key is not None:
        counts[key] += 1


async def _judged(ctx: JobContext, rows: list[Record], tally: Tally) -> list[Record]:
    """``rows`` with their verdicts: ``status`` approved or rejected, ``judgment`` (counted into
    ``tally``, and their ids digested per output). An approved row the round's spot check picks
    (:mod:`~airflow_batchinfer.judges.spot_check`) is held back for people as a low-scored one is; a
    judge people check counts its judged rows per stratum (the calibration's weights)."""
    judged = []
    counts = tally.counts
    p = ctx.params
    checked = not isinstance(p.judge, HumanJudge) and (p.spot_check is not None or p.review_below is not None)
    tenths = p.judge is not None and p.judge.kind not in RAW_SCORES  # a reward's raw score has none
    for row, verdict in await _judge_rows(ctx, rows, tally):
        judgment = verdict.as_dict()
        cut = row_decision(row, p.truncation)
        if cut.truncated:  # judged or not: the round counts its truncated rows
            counts["truncated"] += 1
        stratum: spot_check.Stratum = "approved" if verdict.approved else "rejected"
        if row.get("status") == "error":
            counts["inference_errors"] += 1
        elif cut.reject:
            pass  # half an answer is retried, not put before people
        elif _for_review(ctx, verdict):  # a person decides: held back from results, on the review page
            if not isinstance(p.judge, HumanJudge):
                judgment.update(
                    approved=False, judge_approved=verdict.approved, reason=f"for review: {verdict.reason}"
                )
            judgment["for_review"] = True
            counts["for_review"] += 1
            stratum = "held" if verdict.approved else "rejected"
        elif verdict.approved and p.spot_check is not None and p.spot_check.holds(ctx.record_id(row)):
            judgment.update(
                approved=False,
                judge_approved=True,
                reason=spot_check.spot_check_reason(verdict.reason),
                for_review=True,
                spot_check=True,
            )
            counts["for_review"] += 1
            counts["spot_checks"] += 1
        if checked and row.get("status") != "error" and not cut.reject:
            counts[spot_check.stratum_key(stratum, verdict.score if tenths else None)] += 1
        status = "approved" if judgment["approved"] else "rejected"
        counts[status] += 1
        _count_adapter(counts, row, status, judgment)
        if status == "rejected":
            tally.reason_groups.add(judgment["reason"])
        judged.append({**row, "status": status, "judgment": judgment})
    for name in ("approved", "rejected"):
        tally.count_ids(name, record_ids((r for r in judged if r["status"] == name), ctx.params.id_field))
    return judged


async def _judge_job(ctx: JobContext, infer: _Inference | None) -> dict[str, int]:
    """Judge every row of the input into approved and rejected; with ``infer``, generate the rows
    first (the fused job: the shard is read once, and nothing is written in between)."""
    ctx.progress.total = ctx.params.input_records

    async def process(chunk: list[Record], tally: Tally) -> list[Record]:
        return await _judged(ctx, await infer(chunk, tally) if infer is not None else chunk, tally)

    def split(rows: list[Record]) -> dict[str, list[Record]]:
        return {name: [r for r in rows if r["status"] == name] for name in ("approved", "rejected")}

    await _run_chunks(ctx, process, split)
    return dict(ctx.counts)


async def run_judge(ctx: JobContext) -> dict[str, int]:
    return await _judge_job(ctx, None)


async def run_infer_judge(ctx: JobContext) -> dict[str, int]:
    """Infer and judge in one pass: a rule judge, or an LLM judge served by this worker's engine."""
    return await _judge_job(ctx, _Inference(ctx))


# --------------------------------------------------------------------------------------- in place
async def run_in_place(ctx: JobContext) -> dict[str, int]:
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
    ctx.counts["resumed"] = sum(1 for s in state.values() if s.attempts)
    approved_out = ctx.file(ctx.output("approved")).writer()
    rejected_out = ctx.file(ctx.output("rejected")).writer()
    window = asyncio.Semaphore(p.chunk_size)

    async def finish(row: Record) -> None:
        ctx.counts[row["status"]] += 1
        _count_adapter(ctx.counts, row, row["status"])
        if row["status"] != "approved":
            ctx.count_rejected(row)
        ctx.count_ids("approved" if row["status"] == "approved" else "rejected", (row,))
        await (approved_out if row["status"] == "approved" else rejected_out).write(row)
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
                ctx.counts["attempts"] += 1
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
                    ctx.counts["truncated"] += 1  # attempts cut at max_tokens
                ((row, verdict),) = await _judge_rows(ctx, [row])
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
    ctx.counts["checkpoint_segments"] = log.segments_written
    ctx.cleanup.append(log.clear)  # once the manifest records completion, checkpoints have served
    return dict(ctx.counts)


SHARD_JOBS: dict[str, Callable[[JobContext], Awaitable[dict[str, int]]]] = {
    "infer": run_infer,
    "judge": run_judge,
    "infer_judge": run_infer_judge,
    "in_place": run_in_place,
}
