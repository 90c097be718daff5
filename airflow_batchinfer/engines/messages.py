"""Chat messages as a chat template takes them: content parts flattened as vLLM's server does.

A message's ``content`` may be a list of OpenAI content parts. vLLM's server decides per chat
template whether the template reads parts (the "openai" content format: it loops over a message's
``content``) or a string (the "string" format), by the template's Jinja syntax tree
(``vllm/renderers/hf.py`` ``_detect_content_format``); for a string-format template a message's text
parts are joined with ``"\\n"``. :func:`chat_messages` mirrors that, so ``[{"type": "text", "text":
"hi"}]`` renders as ``"hi"`` on SmolLM2's template and not as a Python list (or a TypeError). A
``tool`` message whose parts are all text is flattened on either format (vLLM does so too). String
contents pass unchanged. Every engine path that renders text-only messages goes through it (messages
with images keep :func:`~airflow_batchinfer.engines.images.template_messages`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any, Literal

ContentFormat = Literal["string", "openai"]


def template_text(tokenizer: Any) -> str | None:
    """The tokenizer's (or processor's) chat template source (a named set: its ``default``)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, Mapping):
        template = template.get("default")
    return template if isinstance(template, str) else None


@lru_cache(maxsize=32)
def content_format(template: str | None) -> ContentFormat:
    """``"openai"`` when the template loops over a message's ``content`` (or over a ``content``
    variable), ``"string"`` otherwise or when it does not parse (vLLM's default)."""
    if template is None:
        return "string"
    import jinja2
    from jinja2 import nodes

    try:
        root = jinja2.Environment().parse(template)
    except jinja2.TemplateSyntaxError:
        return "string"
    message_vars = {
        loop.target.name
        for loop in root.find_all(nodes.For)
        if isinstance(loop.target, nodes.Name) and _names(loop.iter, "messages")
    }
    for loop in root.find_all(nodes.For):
        it = loop.iter
        if isinstance(it, nodes.Name) and it.name == "content":
            return "openai"
        if any(_names(it, var, "content") for var in message_vars):
            return "openai"
    return "string"


def _names(node: Any, var: str, key: str | None = None) -> bool:
    """Whether ``node`` is ``var`` (``key`` None), or ``var.key`` / ``var['key']``."""
    from jinja2 import nodes

    if key is None:
        return isinstance(node, nodes.Name) and node.name == var
    if isinstance(node, nodes.Getattr):
        return node.attr == key and _names(node.node, var)
    if isinstance(node, nodes.Getitem):
        return isinstance(node.arg, nodes.Const) and node.arg.value == key and _names(node.node, var)
    return False


def flat_text(content: Any) -> str:
    """A message's ``content`` as text: a string as it is, a list's text parts joined with ``"\n"``
    (what an engine without a chat template reads, and the token estimates count)."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", "")) for p in content if isinstance(p, Mapping) and p.get("type") == "text"
        )
    return str(content)


def chat_messages(messages: Sequence[Mapping[str, Any]] | None, tokenizer: Any) -> list[dict[str, Any]]:
    """``messages`` for ``tokenizer``'s chat template: a list content joined to a string (its text
    parts, ``"\\n"`` between) on a string-format template, and in a text-only ``tool`` message."""
    fmt = content_format(template_text(tokenizer))
    out = []
    for m in messages or ():
        content = m.get("content")
        if isinstance(content, list) and (
            fmt == "string"
            or (
                m.get("role") == "tool"
                and all(isinstance(p, Mapping) and p.get("type") == "text" for p in content)
            )
        ):
            content = flat_text(content)
        out.append({**m, "content": content})
    return out
