"""Chat messages as a chat template takes them: content parts flattened as vLLM's server does.

A message's ``content`` may be a list of OpenAI content parts. vLLM's server decides per chat
template whether the template reads parts (the "openai" content format: it loops over a message's
``content``) or a string (the "string" format), by the template's Jinja syntax tree
(``vllm/renderers/hf.py`` ``_detect_content_format``); for a string-format template a message's text
parts are joined with ``"\\n"``. :func:`chat_messages` mirrors that, so ``[{"type": "text", "text":
"hi"}]`` renders as ``"hi"`` on SmolLM2's template and not as a Python list (or a TypeError). A
``tool`` message whose parts are all text is flattened on either format (vLLM does so too). String
contents pass unchanged (vLLM wraps them as one text part for an openai-format template; the cached
LLaVA templates render both alike). Every engine path that renders text-only messages goes through
it (messages with images keep :func:`~airflow_batchinfer.engines.images.template_messages`).
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
    """``"openai"`` when the template loops over a message's ``content`` (of ``messages`` or a variable
    assigned from it, a macro parameter given a message's content, or a ``content`` variable outside
    macros: vLLM's rules), ``"string"`` otherwise or when it does not parse (vLLM's default)."""
    if template is None:
        return "string"
    import jinja2

    try:
        root = jinja2.Environment().parse(template)
    except jinja2.TemplateSyntaxError:
        return "string"
    return "openai" if _loops_over_content(root) else "string"


def _access(node: Any, var: str, key: str | None = None) -> bool:
    """Whether ``node`` reads ``var`` (``key`` None) or ``var.key`` / ``var['key']``, through filters,
    tests and slices (vLLM's ``_is_var_or_elems_access``)."""
    from jinja2 import nodes

    if isinstance(node, nodes.Filter | nodes.Test):
        return node.node is not None and _access(node.node, var, key)
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
        return _access(node.node, var, key)
    if key is None:
        return isinstance(node, nodes.Name) and node.ctx == "load" and node.name == var
    if isinstance(node, nodes.Getitem):
        return isinstance(node.arg, nodes.Const) and node.arg.value == key and _access(node.node, var)
    return isinstance(node, nodes.Getattr) and node.attr == key and _access(node.node, var)


def _loops_over_content(root: Any) -> bool:
    """Whether any ``for`` loop iterates a message's content (vLLM's ``_iter_nodes_assign_content_item``)."""
    from jinja2 import nodes

    names, todo = {"messages"}, ["messages"]  # messages and the variables assigned from it
    while todo:
        name = todo.pop()
        for assign in root.find_all(nodes.Assign):
            target = assign.target
            if isinstance(target, nodes.Name) and target.name not in names and _access(assign.node, name):
                names.add(target.name)
                todo.append(target.name)
    message_vars = {
        loop.target.name
        for loop in root.find_all(nodes.For)
        if isinstance(loop.target, nodes.Name) and any(_access(loop.iter, n) for n in names)
    }
    in_macros: set[int] = set()
    given: dict[int, set[str]] = {}  # a macro's loops: its parameters given a message's content
    for macro in root.find_all(nodes.Macro):
        params = [a.name for a in macro.args]
        content_params: set[str] = set()
        for call in root.find_all(nodes.Call):
            if isinstance(call.node, nodes.Name) and call.node.name == macro.name:
                reads = [(params[i], a) for i, a in enumerate(call.args) if i < len(params)]
                reads += [(k.key, k.value) for k in call.kwargs if k.key in params]
                content_params |= {p for p, a in reads if any(_access(a, m, "content") for m in message_vars)}
        for loop in macro.find_all(nodes.For):
            in_macros.add(id(loop))
            given[id(loop)] = content_params
    for loop in root.find_all(nodes.For):
        it = loop.iter
        if any(_access(it, m, "content") for m in message_vars):
            return True
        if isinstance(it, nodes.Name) and (
            it.name in given.get(id(loop), ()) or (id(loop) not in in_macros and it.name == "content")
        ):
            return True
    return False


def flat_text(content: Any) -> str:
    """A message's ``content`` as text: a string as it is, a list's text parts joined with newlines
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
