"""What one rendering of a prompt template may cost, and the checks that hold it to that: the limits
(:data:`MAX_PROMPT_CHARS`, :data:`MAX_RENDER_STEPS`, :data:`MAX_RENDER_SECONDS`...), the rendering's
counters (:class:`Render`, current in :data:`RENDER` while
:func:`~airflow_batchinfer.prompts.templates.render` runs) and the checks
:class:`~airflow_batchinfer.prompts.templates.BoundedSandbox` calls before it builds a value: sizes,
steps, widths, format specs, and the filters' guards (:func:`guard_filter`).
"""

from __future__ import annotations

import contextvars
import functools
import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from jinja2.exceptions import SecurityError
from jinja2.utils import Namespace

from airflow_batchinfer.exceptions import OverQuickBudget
from airflow_batchinfer.values import whole_number

MAX_PROMPT_CHARS = 1_000_000
"""The longest prompt (and the largest string or list a template may build), in characters/items."""
MAX_RENDER_STEPS = 200_000
"""Loop iterations plus calls one rendering may make."""
MAX_RENDER_SECONDS = 2.0
"""The longest one rendering may take (checked at every step, call, filter and measured value)."""
MAX_ITEMS = 100_000
"""The most elements a list or dict a template handles may hold (so no single filter runs long)."""
MAX_INT_BITS = 100_000
"""The largest integer ``*`` and ``**`` may produce (about 30,000 decimal digits)."""
MAX_BUILT_CHARS = 16 * MAX_PROMPT_CHARS
"""All the text (and list items) one rendering may build, in all: what it may allocate."""
MAX_READ_CHARS = 100 * MAX_PROMPT_CHARS
"""All the text one rendering may hand to calls, filters and comparisons, in all (each may scan it)."""


class _Limits(NamedTuple):
    steps: int
    built: int
    read: int


FULL_LIMITS = _Limits(MAX_RENDER_STEPS, MAX_BUILT_CHARS, MAX_READ_CHARS)
QUICK_LIMITS = _Limits(2_000, 200_000, 200_000)
"""What a rendering may cost inline on an event loop (about a millisecond or two at worst); past it,
:class:`OverQuickBudget`. Ordinary prompt templates stay far below."""


class Render:
    """What one rendering has used: steps, and the sizes of the containers it has measured."""

    def __init__(self, quick: bool = False) -> None:
        self.quick = quick
        self.limits = QUICK_LIMITS if quick else FULL_LIMITS
        self.steps = 0
        self.built = 0
        self.read = 0
        self.deadline = time.monotonic() + MAX_RENDER_SECONDS
        # id -> (the object, kept so the id is not reused; its nodes; its printed length, about)
        self.sizes: dict[int, tuple[Any, int, int]] = {}


RENDER: contextvars.ContextVar[Render | None] = contextvars.ContextVar("batchinfer_render", default=None)


def current() -> Render:
    return RENDER.get() or Render()  # outside render(): compile-time constant folding


def _over(state: Render, error: str) -> Exception:
    return OverQuickBudget(error) if state.quick else SecurityError(error)


def step(n: int = 1) -> None:
    state = RENDER.get()
    if state is not None:
        _on_time(state)
        state.steps += n
        if state.steps > state.limits.steps:
            raise _over(
                state, f"the template took too many steps (over {MAX_RENDER_STEPS} loop iterations and calls)"
            )


def _on_time(state: Render) -> None:
    if time.monotonic() > state.deadline:
        raise _over(state, f"the template took too long (over {MAX_RENDER_SECONDS:g} s for one record)")


def _too_large(what: str, size: int) -> SecurityError:
    return SecurityError(f"{what} too large: {size} (the limit is {MAX_PROMPT_CHARS})")


def check_len(size: int, what: str = "result") -> None:
    if size > MAX_PROMPT_CHARS:
        raise _too_large(what, size)


_CONTAINERS = (list, tuple, dict, set, frozenset, Namespace)


def measure(obj: Any, state: Render) -> tuple[int, int]:
    """``(nodes, chars)`` of ``obj`` as if its shared parts were copies: nodes counts every element,
    chars about the length of its ``str()``. Stops counting past the limit (the result is over it)."""
    if isinstance(obj, str | bytes):
        return 1, len(obj)
    if not isinstance(obj, _CONTAINERS):
        return 1, 24
    known = state.sizes.get(id(obj))
    if known is not None:
        return known[1], known[2]
    if isinstance(obj, Namespace):
        children: Iterable[Any] = [obj._Namespace__attrs]
    elif isinstance(obj, dict):
        children = (x for kv in obj.items() for x in kv)
    else:
        children = obj
    total_nodes, total_chars, visited = 1, 2, 0
    for child in children:
        n, c = measure(child, state)
        total_nodes += n
        total_chars += c + 2
        visited += 1
        if total_nodes > MAX_PROMPT_CHARS and total_chars > MAX_PROMPT_CHARS:
            break
    state.sizes[id(obj)] = (obj, total_nodes, total_chars)
    _read_count(state, visited)  # walking a large record is work too
    return total_nodes, total_chars


def check_value(value: Any, *, printed: bool = False) -> Any:
    """Refuse a container with too many elements (or, ``printed``, too long a ``str()``)."""
    if isinstance(value, _CONTAINERS):
        n, c = measure(value, current())
        if n > MAX_ITEMS:
            raise SecurityError(f"value too large: {n} elements (the limit is {MAX_ITEMS})")
        if printed:
            check_len(c, "value")
    return value


def built(size: int) -> None:
    state = RENDER.get()
    if state is not None:
        state.built += size
        if state.built > state.limits.built:
            raise _over(
                state, f"the template built too large a text: over {MAX_BUILT_CHARS} characters in all"
            )


def _read_count(state: Render, size: int) -> None:
    _on_time(state)
    state.read += size
    if state.read > state.limits.read:
        raise _over(
            state, f"the template took too many steps: it read over {MAX_READ_CHARS} characters in all"
        )


def read(*values: Any) -> None:
    """Text handed to an operation that may scan it (``q.count('x')`` in a loop)."""
    state = RENDER.get()
    if state is not None:
        _read_count(state, sum(len(v) for v in values if isinstance(v, str | bytes)))


def check_result(value: Any) -> Any:
    """A new string or list from an operation: within the limit, and counted as built."""
    if isinstance(value, str | bytes | list | tuple):
        check_len(len(value))
        built(len(value))
    return value


def check_width(value: Any, what: str) -> None:
    n = whole_number(value)
    if n is not None:
        check_len(n, what)


def check_int_bits(bits: int) -> None:
    if bits > MAX_INT_BITS:
        raise SecurityError(f"integer too large: about {bits} bits (the limit is {MAX_INT_BITS})")


# printf-style: %[(key)][flags][width][.precision]; str.format: {field:spec}, {field:{nested}}.
# Linear on any text: no quantifier can retry over the same characters.
_PERCENT_SPEC = re.compile(r"%(?:\([^)]{0,200}\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")
_FORMAT_SPEC = re.compile(r"\{[^{}:]*:([^{}]*)\}")
_NESTED_SPEC = re.compile(r"\{[^{}:]*:[^{}]*\{")
_DIGITS = re.compile(r"\d+")


def check_percent(fmt: Any, args: Any) -> None:
    """A printf-style format: no width or precision over the limit, literal or from ``*``."""
    if not isinstance(fmt, str):
        return
    values = args if isinstance(args, tuple) else (args,)
    for match in _PERCENT_SPEC.finditer(fmt):
        for spec in match.groups():
            if spec == "*":
                for v in values:
                    check_width(v, "format width")
            elif spec is not None:
                check_len(int(spec), "format width")
    for v in values:
        check_value(v, printed=True)


def check_format(fmt: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """``str.format``: no width or precision over the limit, literal or nested (``{:{w}}``)."""
    for match in _FORMAT_SPEC.finditer(fmt):
        for digits in _DIGITS.findall(match.group(1)):
            check_len(int(digits), "format width")
    nested = _NESTED_SPEC.search(fmt) is not None
    for v in [*args, *kwargs.values()]:
        if nested:
            check_width(v, "format width")
        check_value(v, printed=True)


def check_replace(s: Any, old: Any, new: Any, count: Any = -1) -> None:
    text: Any = s  # str or bytes, with old and new of the same kind (else replace raises)
    if all(isinstance(x, str) for x in (s, old, new)) or all(isinstance(x, bytes) for x in (s, old, new)):
        found = len(text) + 1 if not old else text.count(old)
        n = whole_number(count)
        if n is not None and n >= 0:
            found = min(found, n)
        check_len(len(s) + found * (len(new) - len(old)))


def joined(sep: Any, items: Any) -> list[Any]:
    """``items`` as a list, refused when ``sep.join(items)`` would be over the limit."""
    listed: list[Any] = list(items)
    if len(listed) > MAX_ITEMS:
        raise SecurityError(f"value too large: {len(listed)} elements (the limit is {MAX_ITEMS})")
    size = len(sep) * max(len(listed) - 1, 0) if isinstance(sep, str | bytes) else 0
    for item in listed:
        size += len(item) if isinstance(item, str | bytes) else measure(item, current())[1]
    check_len(size)
    return listed


def arg(args: tuple[Any, ...], kwargs: Mapping[str, Any], i: int, name: str, default: Any = None) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[i] if len(args) > i else default


# Filters that turn their input into text: a container input is measured as printed.
_PRINTING_FILTERS = frozenset(
    {
        "capitalize",
        "center",
        "e",
        "escape",
        "forceescape",
        "format",
        "indent",
        "join",
        "lower",
        "pprint",
        "replace",
        "safe",
        "string",
        "striptags",
        "title",
        "tojson",
        "trim",
        "truncate",
        "upper",
        "urlencode",
        "urlize",
        "wordcount",
        "wordwrap",
        "xmlattr",
    }
)


def guard_filter(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its inputs measured first (and, for the filters that pad, repeat or join, the size
    of its result computed first) and its result checked."""
    skip = 1 if getattr(fn, "jinja_pass_arg", None) is not None else 0
    printed = name in _PRINTING_FILTERS

    @functools.wraps(fn)
    def guarded(*all_args: Any, **kwargs: Any) -> Any:
        if len(all_args) <= skip:
            return fn(*all_args, **kwargs)
        value, args = all_args[skip], all_args[skip + 1 :]
        read(value, *args, *kwargs.values())
        for v in (value, *args, *kwargs.values()):
            check_value(v, printed=printed)
        text = value if isinstance(value, str) else None
        if name == "center":
            check_width(arg(args, kwargs, 0, "width"), "width")
        elif name in ("batch", "slice"):
            check_width(arg(args, kwargs, 0, "linecount" if name == "batch" else "slices"), "count")
        elif name == "tojson":
            indent = arg(args, kwargs, 0, "indent")
            if (whole_number(indent) or 0) > 64 or (isinstance(indent, str) and len(indent) > 64):
                raise SecurityError("tojson indent too large (the limit is 64)")
        elif name == "indent" and text is not None:
            width = arg(args, kwargs, 0, "width", 4)
            per_line = n if (n := whole_number(width)) is not None else len(str(width))
            check_len(len(text) + (text.count("\n") + 1) * max(per_line or 0, 0))
        elif name == "wordwrap" and text is not None:
            width = whole_number(arg(args, kwargs, 0, "width", 79)) or 1
            wrap = arg(args, kwargs, 2, "wrapstring") or "\n"
            lines = len(text) // max(width, 1) + text.count("\n") + 1
            check_len(len(text) + lines * len(str(wrap)))
        elif name == "format":
            check_percent(value, args or dict(kwargs))
        elif name == "replace":
            check_replace(value, arg(args, kwargs, 0, "old"), arg(args, kwargs, 1, "new"))
        elif name == "join" and "attribute" not in kwargs and len(args) < 2:
            all_args = (*all_args[:skip], joined(arg(args, kwargs, 0, "d", ""), value), *args)
        return check_result(fn(*all_args, **kwargs))

    return guarded
