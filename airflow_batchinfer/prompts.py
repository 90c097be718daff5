"""Prompts from records: sandboxed Jinja2 templates over record fields, or OpenAI batch bodies.

A record with ``custom_id`` and a ``body`` object is an OpenAI batch request: its ``body.messages``
(or ``body.prompt``) is the prompt and its sampling fields override the job's. Any other record is
rendered through the job's template (``{{ question }}`` reads the record's ``question`` field; the
whole record is also available as ``record``). Rendering errors are per-record errors.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from jinja2 import StrictUndefined, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from airflow_batchinfer.engines.base import GenerationRequest, SamplingParams
from airflow_batchinfer.exceptions import ConfigError


class PromptError(ValueError):
    """A record could not be turned into a prompt; the message says why (becomes the row's error)."""


@functools.lru_cache(maxsize=1)
def _env() -> ImmutableSandboxedEnvironment:
    return ImmutableSandboxedEnvironment(
        undefined=StrictUndefined, autoescape=False, keep_trailing_newline=True
    )


@functools.lru_cache(maxsize=256)
def compile_template(source: str) -> Any:
    try:
        return _env().from_string(source)
    except TemplateError as exc:
        raise ConfigError(f"invalid prompt template: {exc}") from exc


def render(source: str, variables: Mapping[str, Any]) -> str:
    try:
        return str(compile_template(source).render(**variables))
    except TemplateError as exc:
        raise PromptError(f"prompt template: {exc}") from exc


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
    ) -> GenerationRequest:
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
        text = render(self.template, {**record, **(variables or {}), "record": record})
        sampling = attempt_seed(self.sampling, attempt)
        if not self.chat:
            return GenerationRequest(request_id, prompt=text, sampling=sampling, metadata=meta)
        messages = [{"role": "system", "content": self.system}] if self.system else []
        messages.append({"role": "user", "content": text})
        return GenerationRequest(request_id, messages=messages, sampling=sampling, metadata=meta)
