"""Prompts from records: sandboxed Jinja2 templates over record fields, or OpenAI batch bodies.

A record with ``custom_id`` and a ``body`` object is an OpenAI batch request: its ``body.messages``
(or ``body.prompt``) is the prompt and its sampling fields override the job's. Any other record is
rendered through the job's template (``{{ question }}`` reads the record's ``question`` field; the
whole record is also available as ``record``). Rendering errors are per-record errors. Templates
render through :mod:`airflow_batchinfer.templates`: a sandbox with limits on what one
record's rendering may cost. A plain template (text and ``{{ field }}`` over text or integer fields)
is filled in directly when the sandbox would render the same (otherwise the sandbox renders it, or
fails): it is most templates, and the review desk renders hundreds of thousands of prompts for one
text search. :class:`PromptBuilder` is the one renderer:
the worker's jobs, the LLM judge and the desk (what a record was sent) all build with it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from typing import Any

from airflow_batchinfer.engines.base import GenerationRequest, SamplingParams
from airflow_batchinfer.exceptions import OverQuickBudget, PromptError
from airflow_batchinfer.templates import MAX_PROMPT_CHARS, QUICK_LIMITS, compile_template, render

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


def is_openai_batch(record: Mapping[str, Any]) -> bool:
    return "custom_id" in record and isinstance(record.get("body"), dict)


def attempt_seed(sampling: SamplingParams, attempt: int) -> SamplingParams:
    """Each retry of a seeded request samples differently but reproducibly."""
    if sampling.seed is None or attempt <= 1:
        return sampling
    return SamplingParams.from_mapping({"seed": sampling.seed + 1_000_003 * (attempt - 1)}, sampling)


class PromptBuilder:
    """Turns records into :class:`GenerationRequest` s.

    :param template: Jinja2 source over record fields (not needed for OpenAI batch records).
    :param system: optional system message for chat prompts.
    :param chat: wrap the rendered text as a user message, so the model's chat template applies
        (right for instruct models); ``False`` sends the raw text.
    :param sampling: the job's sampling settings.
    """

    def __init__(
        self,
        template: str | None,
        *,
        system: str | None = None,
        chat: bool = True,
        sampling: SamplingParams | None = None,
    ) -> None:
        if template is not None:
            compile_template(template)  # fail fast on a syntax error: that is the job's error
        self.template = template
        self._parts = None if template is None else _plain_parts(template)
        self.system = system
        self.chat = chat
        self.sampling = sampling or SamplingParams()

    def build(
        self,
        record: Mapping[str, Any],
        *,
        request_id: str,
        attempt: int = 1,
        role: str = "infer",
        variables: Mapping[str, Any] | None = None,
        quick: bool = False,
    ) -> GenerationRequest:
        """The request for ``record``; :class:`PromptError` when it cannot be built. ``quick``: render
        within :data:`QUICK_LIMITS` or raise :class:`OverQuickBudget` (see :meth:`abuild`)."""
        meta = {"record_id": request_id, "attempt": attempt, "role": role}
        if is_openai_batch(record):
            body = record["body"]
            sampling = attempt_seed(SamplingParams.from_mapping(body, self.sampling), attempt)
            if isinstance(body.get("messages"), list):
                return GenerationRequest(
                    request_id, messages=body["messages"], sampling=sampling, metadata=meta
                )
            if isinstance(body.get("prompt"), str):
                return GenerationRequest(request_id, prompt=body["prompt"], sampling=sampling, metadata=meta)
            raise PromptError("OpenAI batch body has neither 'messages' (a list) nor 'prompt' (a string)")
        if self.template is None:
            raise PromptError("no prompt template was given and the record is not an OpenAI batch request")
        text = None if self._parts is None else _filled(self._parts, record, variables, quick=quick)
        if text is None:
            text = render(self.template, {**record, **(variables or {}), "record": record}, quick=quick)
        sampling = attempt_seed(self.sampling, attempt)
        if not self.chat:
            return GenerationRequest(request_id, prompt=text, sampling=sampling, metadata=meta)
        messages = [{"role": "system", "content": self.system}] if self.system else []
        messages.append({"role": "user", "content": text})
        return GenerationRequest(request_id, messages=messages, sampling=sampling, metadata=meta)

    async def abuild(self, record: Mapping[str, Any], **kwargs: Any) -> GenerationRequest:
        """:meth:`build` from an event loop: inline when the rendering fits :data:`QUICK_LIMITS` (an
        ordinary template: no thread hop), else again in a thread with the full limits, so a heavy
        template never holds the loop for more than a moment."""
        try:
            return self.build(record, quick=True, **kwargs)
        except OverQuickBudget:
            return await asyncio.to_thread(self.build, record, **kwargs)
