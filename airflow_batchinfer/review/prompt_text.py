"""A round's prompt as the worker sent it, as text for the review desk: the package's one renderer
(:class:`~airflow_batchinfer.prompts.build.PromptBuilder`) with the round's settings."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Mapping
from typing import Any

from airflow_batchinfer.prompts.build import PromptBuilder
from airflow_batchinfer.prompts.retries import NO_RETRY, Previous, RetrySettings

MAX_SHOWN_URL = 300  # characters of an image's path or URL in a prompt's text


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
        images = itertools.count(1)
        return _as_text(
            [(str(m.get("role", "")), _content(m.get("content"), images)) for m in request.messages or ()]
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


def _content(value: Any, images: Iterator[int] | None = None) -> str:
    """A message's content as text; ``images`` numbers its image parts (from 1 unless given)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts: their text, each image as a line of its own
        numbers = itertools.count(1) if images is None else images
        return "\n".join(_part(p, numbers) for p in value)
    return json.dumps(value, ensure_ascii=False)


def _part(part: Any, images: Iterator[int]) -> str:
    """A content part as the desk shows it: a text part's text; an image part as ``[image N: what]``
    (numbered across the prompt: the desk's ``/image`` route serves image N of a ``data:`` URL and
    the page shows it as a thumbnail), never its base64; another part as JSON."""
    if isinstance(part, dict) and isinstance(part.get("text"), str):
        return str(part["text"])
    image = part.get("image_url") if isinstance(part, dict) and part.get("type") == "image_url" else None
    url = image.get("url") if isinstance(image, dict) else None
    if not isinstance(url, str):
        return json.dumps(part, ensure_ascii=False)[:MAX_SHOWN_URL]
    n = next(images)
    if url[:5].lower() == "data:":
        mime = url[5:].partition(",")[0].partition(";")[0][:40]
        kib = len(url.partition(",")[2]) * 3 // 4 / 1024
        return f"[image {n}: data:{mime}, {kib:.1f} KiB]"
    return f"[image {n}: {url[:MAX_SHOWN_URL]}]"
