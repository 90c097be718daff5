"""A round's prompt as the worker sent it, as text for the review desk: the package's one renderer
(:class:`~airflow_batchinfer.prompts.build.PromptBuilder`) with the round's settings."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from airflow_batchinfer.prompts.build import PromptBuilder
from airflow_batchinfer.prompts.retries import NO_RETRY, Previous, RetrySettings


class Prompts:
    """The prompt the worker sent for a record, as text: the package's one renderer,
    :class:`~airflow_batchinfer.prompts.build.PromptBuilder`, with the round's template, system message and
    retry settings (a retry's prompt renders from the ``previous`` its row carries; chat messages
    shown as ``[role]`` blocks; a lone user message as its text)."""

    def __init__(self, template: str | None, system: str | None, retry: RetrySettings = NO_RETRY) -> None:
        self.builder = PromptBuilder(template, system=system, retry=retry)  # a bad template: ConfigError

    def text(
        self, record: dict[str, Any], rid: str, attempts: int, previous: Mapping[str, Any] | None = None
    ) -> str | None:
        """The prompt's text, or ``None`` when it cannot be built (the page shows the record)."""
        try:
            told = None if previous is None else Previous.from_dict(previous)
            request = self.builder.build(record, request_id=rid, attempt=max(attempts, 1), previous=told)
        except Exception:  # a bad template or record: the page shows the record instead
            return None
        if request.prompt is not None:
            return request.prompt
        return _as_text(
            [(str(m.get("role", "")), _content(m.get("content"))) for m in request.messages or ()]
        )


def _as_text(messages: list[tuple[str, str]]) -> str:
    if len(messages) == 1 and messages[0][0] == "user":
        return messages[0][1]
    return "\n\n".join(f"[{role}]\n{content}" for role, content in messages)


def render(
    prompts: Prompts | None,
    record: dict[str, Any],
    rid: str,
    attempts: int,
    previous: Mapping[str, Any] | None = None,
) -> str | None:
    """The record's prompt as text (:meth:`Prompts.text`); ``None`` without prompts."""
    return None if prompts is None else prompts.text(record, rid, attempts, previous)


def _content(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts: their text
        texts = [p.get("text") for p in value if isinstance(p, dict) and isinstance(p.get("text"), str)]
        if len(texts) == len(value):
            return "\n".join(t for t in texts if t is not None)
    return json.dumps(value, ensure_ascii=False)
