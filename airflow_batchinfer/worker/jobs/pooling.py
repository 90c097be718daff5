"""The infer job of a pooling task (``params.task``: embed, classify, score;
:mod:`~airflow_batchinfer.engines.pooling`): each record's text read, sent through the worker's shared
batcher to the engine's ``embed`` or ``score``, and its row built. Everything else is the generate
job's (:mod:`.infer`): the same chunks, segments, accounting and outputs, one row per record.

A record's text: an OpenAI batch request's ``body.input`` (``/v1/embeddings``: a string, or for embed a
list of strings), its ``body.messages`` (through the model's chat template; an image part is that
record's error: pooling reads text) or ``body.prompt``; else
the job's ``prompt_template`` rendered over the record, as raw text (no chat template: what the model
reads is the record's text). Rows (``output_format: rows``) carry ``task`` and:

- embed: ``embedding`` (the base64 of the vector's little-endian float32 values,
  :func:`~airflow_batchinfer.engines.pooling.encode_vector`), ``embedding_dtype`` and ``dimensions``;
  a list input's vectors in ``embeddings``, in its order; ``result`` null;
- classify: ``label`` (the likeliest, also the row's ``result``, what judges read) and ``probs``
  (each label's probability);
- score: the raw outputs, ``score`` for a single-output head, else ``scores`` by label; ``result`` null.

``output_format: openai`` writes the lines ``vllm run-batch`` writes: an embedding list
(``{"object": "list", "data": [{"object": "embedding", "embedding": [...], "index": 0}], ...}``,
floats, or base64 with ``encoding_format: base64``) or vLLM's classification list.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_batchinfer.engines.messages import flat_text
from airflow_batchinfer.engines.pooling import (
    EMBEDDING_DTYPE,
    EmbedRequest,
    EmbedResult,
    classify,
    encode_vector,
)
from airflow_batchinfer.engines.scoring import ScoreRequest, ScoreResult
from airflow_batchinfer.prompts.build import PromptError, is_openai_batch
from airflow_batchinfer.prompts.retries import attempts_before
from airflow_batchinfer.state.tally import Generated
from airflow_batchinfer.storage.records import Record
from airflow_batchinfer.worker.jobs import columns
from airflow_batchinfer.worker.jobs.context import JobContext
from airflow_batchinfer.worker.segments import ChunkFigures

# The body fields of an OpenAI embeddings (or vLLM classify) request that are read; any other is
# refused, naming it, never dropped (``user`` identifies the caller: it changes no output).
BODY_FIELDS = frozenset({"model", "input", "messages", "prompt", "dimensions", "encoding_format", "user"})
ENCODINGS = ("float", "base64")


@dataclass(frozen=True)
class Text:
    """A record's texts for the engine, or why it has none (``error``)."""

    prompts: tuple[str, ...] = ()
    messages: Sequence[Mapping[str, Any]] | None = None
    many: bool = False  # a list input: one vector per element
    dimensions: int | None = None
    encoding_format: str = "float"
    error: str | None = None


def image_refusal(messages: Any, task: str, record: str) -> str | None:
    """Why ``messages`` cannot be pooled: an image part (a pooling task reads text; its images would be
    dropped), naming the record and the part; ``None`` without any."""
    for n, m in enumerate(messages if isinstance(messages, list) else ()):
        content = m.get("content") if isinstance(m, Mapping) else None
        for i, p in enumerate(content if isinstance(content, list) else ()):
            if isinstance(p, Mapping) and p.get("type") == "image_url":
                return (
                    f"record {record}: messages[{n}].content[{i}] is an image part, and task {task} "
                    "pools text only: send it in a generate task to a pool serving a vision-language model"
                )
    return None


def body_text(body: Mapping[str, Any], task: str, record: str = "?") -> Text:
    """What an OpenAI batch body asks to pool (an error :class:`Text` naming the field it refuses;
    ``record``: its id, named by a refusal of image parts)."""
    unknown = sorted(set(body) - BODY_FIELDS)
    if unknown:
        return Text(
            error=f"body: {', '.join(unknown)}: not read by task {task} (it reads {sorted(BODY_FIELDS)})"
        )
    dims, fmt = body.get("dimensions"), body.get("encoding_format", "float")
    if dims is not None and (
        task != "embed" or isinstance(dims, bool) or not isinstance(dims, int) or dims < 1
    ):
        return Text(error=f"body: dimensions {dims!r}: an embed task's vector length, an integer >= 1")
    if fmt not in ENCODINGS:
        return Text(error=f"body: encoding_format {fmt!r}: one of {', '.join(ENCODINGS)}")
    given = [k for k in ("input", "messages", "prompt") if body.get(k) is not None]
    if len(given) != 1:
        return Text(
            error="body: give exactly one of input (a string or a list of strings), messages or prompt"
        )
    value = body[given[0]]
    if given[0] == "messages":
        if not isinstance(value, list) or not value:
            return Text(error="body: messages must be a non-empty list of chat messages")
        why = image_refusal(value, task, record)
        if why is not None:
            return Text(error=f"body: {why}")
        return Text(messages=value, dimensions=dims, encoding_format=fmt)
    if isinstance(value, str):
        return Text((value,), dimensions=dims, encoding_format=fmt)
    if given[0] == "input" and isinstance(value, list) and value and all(isinstance(x, str) for x in value):
        if task != "embed":
            return Text(error=f"body: input: a {task} task reads one text per record, not a list")
        return Text(tuple(value), many=True, dimensions=dims, encoding_format=fmt)
    return Text(
        error=f"body: {given[0]} must be a string{' or a list of strings' if task == 'embed' else ''}"
    )


class Pooling:
    """A pooling task's rows for one job's chunks (``infer`` and ``infer_judge``, as
    :class:`~.infer.Inference` for generation)."""

    def __init__(self, ctx: JobContext) -> None:
        assert ctx.params.prompts is not None
        self.ctx, self.task, self.prompts = ctx, ctx.params.task, ctx.params.prompts
        self.created = int(time.time())
        described = ctx.runtime.describe()
        self.model = str(described.get("model", described.get("engine")))

    def text(self, record: Mapping[str, Any]) -> Text:
        if (clash := columns.clash(record, self.ctx.params.round, self.task)) is not None:
            return Text(error=clash)
        rid = self.ctx.record_id(record)
        if is_openai_batch(record):
            return body_text(record["body"], self.task, rid)
        try:
            request = self.prompts.build(record, request_id=rid)
        except PromptError as exc:
            return Text(error=str(exc))
        if request.prompt is not None:
            return Text((request.prompt,))
        why = image_refusal(request.messages, self.task, rid)
        if why is not None:
            return Text(error=why)
        # the template's text, as it is: a chat template would embed or classify the model's turn markup
        return Text((flat_text((request.messages or [{}])[-1].get("content")),))

    async def __call__(self, chunk: list[Record], figures: ChunkFigures) -> list[Record]:
        texts = await asyncio.to_thread(lambda: [self.text(r) for r in chunk])
        if self.task == "embed":
            outs: list[Any] = await self._embed(texts, figures)
        else:
            outs = await self._score(texts, figures)
        rows, counts = await asyncio.to_thread(self.rows, chunk, texts, outs)
        figures.tally.generated += counts
        return rows

    async def _embed(self, texts: list[Text], figures: ChunkFigures) -> list[list[EmbedResult] | str]:
        requests = []
        for i, t in enumerate(texts):
            if t.messages is not None:
                requests.append(EmbedRequest(f"{i}", messages=t.messages, dimensions=t.dimensions))
            requests += [
                EmbedRequest(f"{i}.{j}", prompt=p, dimensions=t.dimensions) for j, p in enumerate(t.prompts)
            ]
        results = iter(await self.ctx.runtime.embed(requests) if requests else [])
        out: list[list[EmbedResult] | str] = []
        for t in texts:
            if t.error is not None:
                out.append(t.error)
                continue
            mine = [next(results) for _ in range(1 if t.messages is not None else len(t.prompts))]
            figures.tokens["prompt"] += sum(r.prompt_tokens for r in mine)
            out.append(mine)
        return out

    async def _score(self, texts: list[Text], figures: ChunkFigures) -> list[ScoreResult | str]:
        requests = [
            ScoreRequest(f"{i}", messages=t.messages)
            if t.messages is not None
            else ScoreRequest(f"{i}", t.prompts[0])
            for i, t in enumerate(texts)
            if t.error is None
        ]
        results = iter(await self.ctx.score(requests, chunk=figures) if requests else [])
        return [t.error if t.error is not None else next(results) for t in texts]

    def rows(self, chunk: list[Record], texts: list[Text], outs: list[Any]) -> tuple[list[Record], Generated]:
        p = self.ctx.params
        rows, counts = [], Generated()
        for record, text, out in zip(chunk, texts, outs, strict=True):
            error = out if isinstance(out, str) else _error(out)
            fields: dict[str, Any] = {}
            if error is None:
                try:
                    fields = self._fields(text, out)
                except (
                    ValueError
                ) as exc:  # outputs that do not fit the labels: this record's, not the chunk's
                    error = f"{self.task}: the model's outputs do not fit its labels: {exc}"
            if error is None:
                counts.ok += 1
            else:
                counts.error += 1
            if p.output_format == "openai":
                rows.append(self._openai_line(record, text, out, error, fields))
                continue
            before, _ = attempts_before(record, p.round)
            row = columns.base(record, p.round, self.task)
            row.update(
                task=self.task,
                result=fields.pop("result", None),
                status="error" if error is not None else "ok",
                error=error,
                attempts=before + 1,
                round=p.round,
                **fields,
            )
            rows.append(row)
        return rows, counts

    def _fields(self, text: Text, out: Any) -> dict[str, Any]:
        """A row's fields of the task's output (see the module's text)."""
        if self.task == "embed":
            vectors = [r.vector for r in out]
            encoded = [encode_vector(v) for v in vectors]
            fields: dict[str, Any] = {
                "embeddings" if text.many else "embedding": encoded if text.many else encoded[0]
            }
            return {**fields, "embedding_dtype": EMBEDDING_DTYPE, "dimensions": len(vectors[0])}
        model = self.ctx.runtime.engine.scoring
        assert model is not None and out.logits is not None
        if self.task == "classify":
            label, probs = classify(out.logits, model)
            return {"result": label, "label": label, "probs": probs}
        if len(out.logits) == 1:
            return {"score": out.logits[0]}
        return {"scores": dict(zip(model.labels, out.logits, strict=True))}

    def _openai_line(
        self, record: Mapping[str, Any], text: Text, out: Any, error: str | None, fields: Mapping[str, Any]
    ) -> Record:
        """One line of an OpenAI batch output file, as ``vllm run-batch`` writes it."""
        custom_id = record.get("custom_id", record.get("id"))
        digest = hashlib.sha256(f"{custom_id}".encode()).hexdigest()[:24]
        line: dict[str, Any] = {"id": f"batch_req_{digest}", "custom_id": custom_id, "response": None}
        if error is not None:
            return {**line, "error": {"code": "inference_error", "message": error}}
        body = record.get("body") if isinstance(record.get("body"), dict) else {}
        assert isinstance(body, dict)
        model = self.ctx.runtime.engine.scoring
        if self.task == "embed":
            tokens = sum(r.prompt_tokens for r in out)
            data = [
                {
                    "index": i,
                    "object": "embedding",
                    "embedding": encode_vector(r.vector)
                    if text.encoding_format == "base64"
                    else list(r.vector),
                }
                for i, r in enumerate(out)
            ]
            kind = "embd"
        else:
            assert model is not None
            tokens = out.prompt_tokens
            probs = list(fields["probs"].values()) if "probs" in fields else list(out.logits)
            label = fields.get("label", model.labels[max(range(len(probs)), key=probs.__getitem__)])
            data = [{"index": 0, "label": label, "probs": probs, "num_classes": len(probs)}]
            kind = "classify"
        usage = {
            "prompt_tokens": tokens,
            "total_tokens": tokens,
            "completion_tokens": 0,
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        }
        response = {
            "id": f"{kind}-{digest}",
            "object": "list",
            "created": self.created,
            "model": body.get("model", self.model),
            "data": data,
            "usage": usage,
        }
        return {
            **line,
            "response": {"status_code": 200, "request_id": f"req_{digest}", "body": response},
            "error": None,
        }


def _error(out: Any) -> str | None:
    """The first error of an engine's answer for a record (one result, or several for a list input)."""
    for r in out if isinstance(out, list) else [out]:
        if r.error is not None:
            return str(r.error)
    return None
