"""Prompts from records: sandboxed Jinja2 templates over record fields, or OpenAI batch bodies.

A record with ``custom_id`` and a ``body`` object is an OpenAI batch request: its ``body.messages``
(or ``body.prompt``) is the prompt and its sampling fields override the job's; a body field the
job's engine does not honour (or that no engine does, or an unknown one) makes the record a prompt
error naming it (:func:`~airflow_batchinfer.engines.sampling.refusals`), never a silent drop, and so
does a field of the job's own sampling its engine does not honour. Any other record is
rendered through the job's template (``{{ question }}`` reads the record's ``question`` field; the
whole record is also available as ``record``; a retry's ``previous``, what the attempt before it got:
:mod:`~airflow_batchinfer.prompts.retries`, which also decides each attempt's template, system message and
sampling). A job's records pick their LoRA adapter by name
(:mod:`~airflow_batchinfer.engines.adapters`). Rendering errors are per-record errors. Templates
render through :mod:`airflow_batchinfer.prompts.templates`: a sandbox with limits on what one
record's rendering may cost. A plain template (text and ``{{ field }}`` over text or integer fields)
is filled in directly when the sandbox would render the same (otherwise the sandbox renders it, or
fails): it is most templates, and the review desk renders hundreds of thousands of prompts for one
text search. :class:`PromptBuilder` is the one renderer:
the worker's jobs, the LLM judge and the desk (what a record was sent) all build with it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from airflow_batchinfer.engines.adapters import Adapter, chosen
from airflow_batchinfer.engines.base import GenerationRequest, SamplingParams
from airflow_batchinfer.engines.sampling import completion_tokens, engine_refusal, refusals
from airflow_batchinfer.exceptions import ConfigError, OverQuickBudget, PromptError
from airflow_batchinfer.prompts.render_budget import MAX_PROMPT_CHARS, QUICK_LIMITS
from airflow_batchinfer.prompts.retries import (
    NO_RETRY,
    PREVIOUS,
    Previous,
    RetrySettings,
    Sent,
    attempt_seed,
    attempt_template,
    reads_previous,
    sent_with,
)
from airflow_batchinfer.prompts.templates import compile_template, render

__all__ = ["MAX_PROMPT_CHARS", "PromptBuilder", "PromptError", "attempt_seed", "is_openai_batch", "render"]


_FIELD = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_JINJA_OPEN = ("{{", "{%", "{#")
# Names Jinja does not read from the context as written: literals, the whole record, and ``self``
# (the template's own reference).
_NOT_FIELDS = frozenset({"true", "false", "none", "True", "False", "None", "record", "self"})
_NEWLINE = re.compile(r"\r\n|\r|\n")  # Jinja renders each newline of a template's text as "\n"
_MISSING = object()


def _plain_parts(template: str) -> list[str] | None:
    """``template`` as literal, field, literal, …, literal when it is plain text and ``{{ field }}``
    substitutions; ``None`` when anything else (a filter, a tag, a literal) needs Jinja."""
    parts = _FIELD.split(template)
    literals, names = parts[0::2], parts[1::2]
    if any(d in lit for lit in literals for d in _JINJA_OPEN) or _NOT_FIELDS & set(names):
        return None
    parts[0::2] = [_NEWLINE.sub("\n", lit) for lit in literals]
    return parts


def _passable(names: Mapping[str, Any] | None) -> bool:
    """Whether Jinja takes every key of ``names`` as a context variable: it is passed as keyword
    arguments (``Template.generate(self, **ctx)``), so a key that is not a string, or ``self``, fails
    every rendering of the record."""
    return not names or ("self" not in names and all(isinstance(k, str) for k in names))


def _filled(
    parts: list[str], record: Mapping[str, Any], variables: Mapping[str, Any] | None, *, quick: bool
) -> str | None:
    """The plain template ``parts`` over ``record`` and ``variables`` (which win), as the sandbox
    renders it; ``None`` whenever the sandbox might not render exactly that (it then renders it, or
    raises its error): a key Jinja cannot take, a field missing or not text or an integer, a prompt
    over :data:`MAX_PROMPT_CHARS`, or (``quick``) fields over the quick budget's text."""
    if not (_passable(record) and _passable(variables)):
        return None
    out = []
    built = 0  # what the sandbox counts against its budget: the text of the fields it prints
    for k, part in enumerate(parts):
        if not k % 2:
            out.append(part)
            continue
        value = variables.get(part, _MISSING) if variables else _MISSING
        if value is _MISSING:
            value = record.get(part, _MISSING)
        if type(value) is str:
            out.append(value)
            built += len(value)
        elif type(value) is int:
            try:
                out.append(str(value))
            except ValueError:  # over Python's digit limit for int -> str: the sandbox's error
                return None
        else:
            return None
    if quick and built > QUICK_LIMITS.built:
        return None  # the sandbox raises OverQuickBudget: rendered again with the full limits
    text = "".join(out)
    return text if len(text) <= MAX_PROMPT_CHARS else None


_PROMPT_FIELDS = frozenset({"messages", "prompt"})
_CONSTRAINT_FIELDS = ("structured_outputs", "response_format")  # a schema, a regex: checked in a thread
_DECIDED_MAX = 4096  # distinct sets of a body's sampling fields a builder remembers the decision of


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _sampling_key(body: Mapping[str, Any]) -> tuple[tuple[str, type, Any], ...]:
    """A body's fields but its prompt, hashable (JSON for lists and objects, keys in their order: a
    JSON schema's properties are answered in it; the type keeps ``1``, ``1.0`` and ``true`` apart).
    Per record of a batch file: kept cheap; a long value by its digest, so the builder's memory of
    decisions stays small whatever the records hold."""
    return tuple(
        [
            (k, v.__class__, _short(v if v.__class__ in _SCALARS else json.dumps(v, default=str)))
            for k, v in body.items()
            if k not in _PROMPT_FIELDS
        ]
    )


def _short(value: Any) -> Any:
    if isinstance(value, str) and len(value) > 256:
        return hashlib.blake2b(value.encode("utf-8", "surrogatepass"), digest_size=20).digest()
    return value


def is_openai_batch(record: Mapping[str, Any]) -> bool:
    return "custom_id" in record and isinstance(record.get("body"), dict)


class PromptBuilder:
    """Turns records into :class:`GenerationRequest` s.

    :param template: Jinja2 source over record fields (not needed for OpenAI batch records).
    :param system: optional system message for chat prompts.
    :param chat: wrap the rendered text as a user message, so the model's chat template applies
        (right for instruct models); ``False`` sends the raw text.
    :param sampling: the job's sampling settings.
    :param engine: the engine that runs the requests (``None``: not known here, as for the review
        desk): what its records ask for is refused per record when that engine does not honour it.
    :param adapters: the run's LoRA adapters by name: a record's ``adapter`` field (an OpenAI batch
        body's ``model``) picks the one that answers it (:func:`~airflow_batchinfer.engines.adapters.chosen`),
        and one naming none of them is that record's error. ``None`` (a judge's prompts, the desk's):
        the base model answers, whatever the record says.
    :param retry: the run's retry settings: the template, system message and sampling of the second
        and later attempts (:func:`~airflow_batchinfer.prompts.retries.sent_with` decides each attempt's).
    :param max_tokens_cap: the most ``max_tokens`` a request may ask for (a DAG run's: the deployment's
        ``max_max_tokens``): an OpenAI batch body asking for more is that record's error.
    """

    def __init__(
        self,
        template: str | None,
        *,
        system: str | None = None,
        chat: bool = True,
        sampling: SamplingParams | None = None,
        engine: str | None = None,
        adapters: Mapping[str, Adapter] | None = None,
        retry: RetrySettings = NO_RETRY,
        max_tokens_cap: int | None = None,
    ) -> None:
        for source in (template, retry.template):
            if source is not None:
                compile_template(source)  # fail fast on a syntax error: that is the job's error
        self.template = template
        self.retry = retry
        self._parts = {t: _plain_parts(t) for t in (template, retry.template) if t is not None}
        self.system = system
        self.chat = chat
        self.sampling = sampling or SamplingParams()
        self.engine = engine
        self.adapters = None if adapters is None else dict(adapters)
        self.max_tokens_cap = max_tokens_cap
        # a field of the job's sampling its engine does not honour: every templated record's error;
        # per retry_sampling entry (by its first attempt; 0: none), the same of what that entry runs
        self._refused = {0: self._engine_refusal(self.sampling)}
        for first, fields in retry.sampling:
            combined = SamplingParams.from_mapping(fields, self.sampling)
            where = f"retry_sampling.{first}."
            self._refused[first] = self._refused[0] or self._engine_refusal(combined, where)
        self._decided: dict[tuple[tuple[str, type, Any], ...], SamplingParams | str] = {}  # _sampling_key

    def _engine_refusal(self, sampling: SamplingParams, where: str = "the job's sampling.") -> str | None:
        if self.engine is None:
            return None
        return engine_refusal(sampling.changed(), self.engine, where)

    def _body_sampling(self, body: Mapping[str, Any], request_id: str, quick: bool = False) -> SamplingParams:
        """The job's sampling with ``body``'s fields; :class:`PromptError` naming the record and the
        field when the body (or the job's sampling) asks for one the engine does not honour. Decided
        once per distinct set of fields: a batch file's records mostly share theirs. ``quick`` (on an
        event loop): a body with a constraint raises :class:`OverQuickBudget`, so that its schema or
        regex, user data of any size, is checked in a thread (:meth:`abuild`)."""
        if quick and any(body.get(name) is not None for name in _CONSTRAINT_FIELDS):
            raise OverQuickBudget("a body's structured output constraint is checked off the event loop")
        key = _sampling_key(body)
        decided = self._decided.get(key)
        if decided is None:
            decided = self._decide(body)
            if len(self._decided) < _DECIDED_MAX:
                self._decided[key] = decided
        if isinstance(decided, str):
            raise PromptError(f"record {request_id!r}: {decided}")
        return decided

    def _decide(self, body: Mapping[str, Any]) -> SamplingParams | str:
        """``body``'s sampling, or why it is refused: anything that fails checking one record's body
        (its schema's compile) is that record's error, never its job's."""
        try:
            refused = refusals(body, self.engine)
            if refused:
                return "; ".join(refused)
            sampling = SamplingParams.from_mapping(body, self.sampling)
        except ConfigError as exc:  # fields the schemas take one by one, not together (min_tokens)
            return f"body: {exc}"
        except RecursionError:  # a schema nested deeper than its check can walk
            return (
                "body: its response_format or structured_outputs schema is nested too deeply to check: "
                "flatten it (or use $defs and $ref for repeated parts)"
            )
        cap, asked = self.max_tokens_cap, completion_tokens(body)
        if cap is not None and asked is not None and sampling.max_tokens > cap:  # the body is user data
            return (
                f"body: max_tokens {sampling.max_tokens} is above this run's cap {cap} (max_tokens_cap; "
                "a DAG run's is the deployment's max_max_tokens): ask for at most that"
            )
        return self._engine_refusal(sampling) or sampling

    def build(
        self,
        record: Mapping[str, Any],
        *,
        request_id: str,
        attempt: int = 1,
        role: str = "infer",
        variables: Mapping[str, Any] | None = None,
        quick: bool = False,
        candidate: int = 0,
        previous: Previous | None = None,
        least_max_tokens: int | None = None,
        least_thinking_tokens: int | None = None,
    ) -> GenerationRequest:
        """The request for attempt ``attempt`` of ``record``; :class:`PromptError` when it cannot be
        built. ``quick``: render within :data:`QUICK_LIMITS` or raise :class:`OverQuickBudget` (see
        :meth:`abuild`). ``candidate``: which of the record's candidates a judge's request is about
        (metadata). An ``infer`` prompt (``role``) renders with the variable ``previous`` (the
        attempt before, ``None`` on a first attempt); ``least_max_tokens`` and ``least_thinking_tokens``:
        the truncation decision on that attempt (:func:`~airflow_batchinfer.prompts.retries.sent_with`)."""
        meta: dict[str, Any] = {"record_id": request_id, "attempt": attempt, "role": role}
        least = (least_max_tokens, least_thinking_tokens)
        if candidate:
            meta["candidate"] = candidate
        adapter = self._adapter(record, request_id)
        if is_openai_batch(record):
            body = record["body"]
            chat = isinstance(body.get("messages"), list)
            if not (chat or isinstance(body.get("prompt"), str)):
                raise PromptError("OpenAI batch body has neither 'messages' (a list) nor 'prompt' (a string)")
            sampling = self._attempt(request_id, attempt, least, body, quick=quick).sampling
            if chat:
                return GenerationRequest(
                    request_id, messages=body["messages"], sampling=sampling, metadata=meta, adapter=adapter
                )
            return GenerationRequest(
                request_id, prompt=body["prompt"], sampling=sampling, metadata=meta, adapter=adapter
            )
        if self.template is None:
            raise PromptError("no prompt template was given and the record is not an OpenAI batch request")
        sent = self._attempt(request_id, attempt, least)
        template, sampling = sent.template or self.template, sent.sampling
        if role == "infer":  # what the attempt before got (None on a first attempt: `if previous` works)
            variables = {**(variables or {}), PREVIOUS: None if previous is None else previous.as_dict()}
        parts = self._parts[template]
        text = None if parts is None else _filled(parts, record, variables, quick=quick)
        if text is None:
            text = render(template, {**record, **(variables or {}), "record": record}, quick=quick)
        if not self.chat:
            return GenerationRequest(
                request_id, prompt=text, sampling=sampling, metadata=meta, adapter=adapter
            )
        messages = [{"role": "system", "content": sent.system}] if sent.system else []
        messages.append({"role": "user", "content": text})
        return GenerationRequest(
            request_id, messages=messages, sampling=sampling, metadata=meta, adapter=adapter
        )

    def _attempt(
        self,
        request_id: str,
        attempt: int,
        least: tuple[int | None, int | None],
        body: Mapping[str, Any] | None = None,
        *,
        quick: bool = False,
    ) -> Sent:
        """What attempt ``attempt`` is sent with (:func:`~airflow_batchinfer.prompts.retries.sent_with`, over
        the job's sampling or an OpenAI batch ``body``'s); :class:`PromptError` when its sampling asks
        the engine for a field it does not honour, or a ``retry_sampling`` entry does not combine
        with the body's."""
        entry = self.retry.entry(attempt)
        if body is None:
            base, refused = self.sampling, self._refused[entry[0] if entry else 0]
        else:
            base, refused = self._body_sampling(body, request_id, quick), None
        try:
            sent = sent_with(
                self.retry,
                attempt=attempt,
                template=self.template if body is None else None,
                system=self.system if body is None else None,
                sampling=base,
                least_max_tokens=least[0],
                least_thinking_tokens=least[1],
            )
        except ConfigError as exc:  # an entry that does not combine with a body's own sampling
            raise PromptError(f"record {request_id!r}: retry_sampling: {exc}") from None
        if body is not None and entry is not None:
            refused = self._engine_refusal(sent.sampling, f"retry_sampling.{entry[0]}.")
        if refused is not None:
            raise PromptError(f"record {request_id!r}: {refused}")
        return sent

    def shows_previous(self, attempt: int) -> bool:
        """Whether attempt ``attempt``'s prompt reads ``previous`` (its rows then carry it)."""
        return reads_previous(attempt_template(self.retry, attempt, self.template))

    def _adapter(self, record: Mapping[str, Any], request_id: str) -> Adapter | None:
        """The adapter that answers ``record`` (``None``: the base model, also for a builder
        without adapters); :class:`PromptError` for one the run does not have."""
        if self.adapters is None:
            return None
        try:
            return chosen(record, self.adapters)
        except ValueError as exc:
            raise PromptError(f"record {request_id!r}: {exc}") from None

    async def abuild(self, record: Mapping[str, Any], **kwargs: Any) -> GenerationRequest:
        """:meth:`build` from an event loop: inline when the rendering fits :data:`QUICK_LIMITS` (an
        ordinary template: no thread hop), else again in a thread with the full limits, so a heavy
        template never holds the loop for more than a moment; an OpenAI batch body with a constraint
        (``response_format``, ``structured_outputs``: a schema or regex to check) always in a thread."""
        try:
            return self.build(record, quick=True, **kwargs)
        except OverQuickBudget:
            return await asyncio.to_thread(self.build, record, **kwargs)
