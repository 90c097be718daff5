"""Prompt and judge templates: Jinja2 in a **bounded** sandbox (:class:`BoundedSandbox`), the immutable
sandbox plus limits on what one record's rendering may cost. A template or record that goes past one
is a :class:`~airflow_batchinfer.exceptions.PromptError` for that record ("too large", "too many
steps", "prompt longer than …"), never a stalled worker or a failed job:

- the prompt is at most :data:`MAX_PROMPT_CHARS` characters (rendering stops there);
- ``*``, ``**``, ``+`` and ``%`` refuse results larger than that (strings, lists) or integers over
  :data:`MAX_INT_BITS` bits — before computing them; nothing is folded at compile time;
- loop iterations and calls (macros, methods, functions) count against :data:`MAX_RENDER_STEPS`, and
  one rendering stops after :data:`MAX_RENDER_SECONDS` (work inside a filter, such as sorting, is not
  counted in steps: the clock and the :data:`MAX_ITEMS` cap on containers bound it);
- padding, repeating and joining operations (``center``, ``indent``, ``wordwrap``, ``replace``,
  ``join``, format widths, ``tojson`` indents…) check the size of their result before building it;
- values made of nested lists/dicts are measured (shared parts counted each time they appear) before
  they are printed, compared, joined or filtered, so a structure doubled in a loop cannot explode.
"""

from __future__ import annotations

import contextvars
import functools
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

from jinja2 import StrictUndefined, TemplateError, nodes
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace
from jinja2.visitor import NodeTransformer

from airflow_batchinfer.exceptions import ConfigError, OverQuickBudget, PromptError
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


# ------------------------------------------------------------------------------------ the limits
class _Render:
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


_RENDER: contextvars.ContextVar[_Render | None] = contextvars.ContextVar("batchinfer_render", default=None)


def _current() -> _Render:
    return _RENDER.get() or _Render()  # outside render(): compile-time constant folding


def _over(state: _Render, error: str) -> Exception:
    return OverQuickBudget(error) if state.quick else SecurityError(error)


def _step(n: int = 1) -> None:
    state = _RENDER.get()
    if state is not None:
        _on_time(state)
        state.steps += n
        if state.steps > state.limits.steps:
            raise _over(
                state, f"the template took too many steps (over {MAX_RENDER_STEPS} loop iterations and calls)"
            )


def _on_time(state: _Render) -> None:
    if time.monotonic() > state.deadline:
        raise _over(state, f"the template took too long (over {MAX_RENDER_SECONDS:g} s for one record)")


def _too_large(what: str, size: int) -> SecurityError:
    return SecurityError(f"{what} too large: {size} (the limit is {MAX_PROMPT_CHARS})")


def _check_len(size: int, what: str = "result") -> None:
    if size > MAX_PROMPT_CHARS:
        raise _too_large(what, size)


_CONTAINERS = (list, tuple, dict, set, frozenset, Namespace)


def _measure(obj: Any, state: _Render) -> tuple[int, int]:
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
        n, c = _measure(child, state)
        total_nodes += n
        total_chars += c + 2
        visited += 1
        if total_nodes > MAX_PROMPT_CHARS and total_chars > MAX_PROMPT_CHARS:
            break
    state.sizes[id(obj)] = (obj, total_nodes, total_chars)
    _read_count(state, visited)  # walking a large record is work too
    return total_nodes, total_chars


def _check_value(value: Any, *, printed: bool = False) -> Any:
    """Refuse a container with too many elements (or, ``printed``, too long a ``str()``)."""
    if isinstance(value, _CONTAINERS):
        n, c = _measure(value, _current())
        if n > MAX_ITEMS:
            raise SecurityError(f"value too large: {n} elements (the limit is {MAX_ITEMS})")
        if printed:
            _check_len(c, "value")
    return value


def _built(size: int) -> None:
    state = _RENDER.get()
    if state is not None:
        state.built += size
        if state.built > state.limits.built:
            raise _over(
                state, f"the template built too large a text: over {MAX_BUILT_CHARS} characters in all"
            )


def _read_count(state: _Render, size: int) -> None:
    _on_time(state)
    state.read += size
    if state.read > state.limits.read:
        raise _over(
            state, f"the template took too many steps: it read over {MAX_READ_CHARS} characters in all"
        )


def _read(*values: Any) -> None:
    """Text handed to an operation that may scan it (``q.count('x')`` in a loop)."""
    state = _RENDER.get()
    if state is not None:
        _read_count(state, sum(len(v) for v in values if isinstance(v, str | bytes)))


def _check_result(value: Any) -> Any:
    """A new string or list from an operation: within the limit, and counted as built."""
    if isinstance(value, str | bytes | list | tuple):
        _check_len(len(value))
        _built(len(value))
    return value


def _check_width(value: Any, what: str) -> None:
    n = whole_number(value)
    if n is not None:
        _check_len(n, what)


def _check_int_bits(bits: int) -> None:
    if bits > MAX_INT_BITS:
        raise SecurityError(f"integer too large: about {bits} bits (the limit is {MAX_INT_BITS})")


# printf-style: %[(key)][flags][width][.precision]; str.format: {field:spec}, {field:{nested}}.
# Linear on any text: no quantifier can retry over the same characters.
_PERCENT_SPEC = re.compile(r"%(?:\([^)]{0,200}\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")
_FORMAT_SPEC = re.compile(r"\{[^{}:]*:([^{}]*)\}")
_NESTED_SPEC = re.compile(r"\{[^{}:]*:[^{}]*\{")
_DIGITS = re.compile(r"\d+")


def _check_percent(fmt: Any, args: Any) -> None:
    """A printf-style format: no width or precision over the limit, literal or from ``*``."""
    if not isinstance(fmt, str):
        return
    values = args if isinstance(args, tuple) else (args,)
    for match in _PERCENT_SPEC.finditer(fmt):
        for spec in match.groups():
            if spec == "*":
                for v in values:
                    _check_width(v, "format width")
            elif spec is not None:
                _check_len(int(spec), "format width")
    for v in values:
        _check_value(v, printed=True)


def _check_format(fmt: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """``str.format``: no width or precision over the limit, literal or nested (``{:{w}}``)."""
    for match in _FORMAT_SPEC.finditer(fmt):
        for digits in _DIGITS.findall(match.group(1)):
            _check_len(int(digits), "format width")
    nested = _NESTED_SPEC.search(fmt) is not None
    for v in [*args, *kwargs.values()]:
        if nested:
            _check_width(v, "format width")
        _check_value(v, printed=True)


def _check_replace(s: Any, old: Any, new: Any, count: Any = -1) -> None:
    text: Any = s  # str or bytes, with old and new of the same kind (else replace raises)
    if all(isinstance(x, str) for x in (s, old, new)) or all(isinstance(x, bytes) for x in (s, old, new)):
        found = len(text) + 1 if not old else text.count(old)
        n = whole_number(count)
        if n is not None and n >= 0:
            found = min(found, n)
        _check_len(len(s) + found * (len(new) - len(old)))


def _joined(sep: Any, items: Any) -> list[Any]:
    """``items`` as a list, refused when ``sep.join(items)`` would be over the limit."""
    listed: list[Any] = list(items)
    if len(listed) > MAX_ITEMS:
        raise SecurityError(f"value too large: {len(listed)} elements (the limit is {MAX_ITEMS})")
    size = len(sep) * max(len(listed) - 1, 0) if isinstance(sep, str | bytes) else 0
    for item in listed:
        size += len(item) if isinstance(item, str | bytes) else _measure(item, _current())[1]
    _check_len(size)
    return listed


def _arg(args: tuple[Any, ...], kwargs: Mapping[str, Any], i: int, name: str, default: Any = None) -> Any:
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


def _guard_filter(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its inputs measured first (and, for the filters that pad, repeat or join, the size
    of its result computed first) and its result checked."""
    skip = 1 if getattr(fn, "jinja_pass_arg", None) is not None else 0
    printed = name in _PRINTING_FILTERS

    @functools.wraps(fn)
    def guarded(*all_args: Any, **kwargs: Any) -> Any:
        if len(all_args) <= skip:
            return fn(*all_args, **kwargs)
        value, args = all_args[skip], all_args[skip + 1 :]
        _read(value, *args, *kwargs.values())
        for v in (value, *args, *kwargs.values()):
            _check_value(v, printed=printed)
        text = value if isinstance(value, str) else None
        if name == "center":
            _check_width(_arg(args, kwargs, 0, "width"), "width")
        elif name in ("batch", "slice"):
            _check_width(_arg(args, kwargs, 0, "linecount" if name == "batch" else "slices"), "count")
        elif name == "tojson":
            indent = _arg(args, kwargs, 0, "indent")
            if (whole_number(indent) or 0) > 64 or (isinstance(indent, str) and len(indent) > 64):
                raise SecurityError("tojson indent too large (the limit is 64)")
        elif name == "indent" and text is not None:
            width = _arg(args, kwargs, 0, "width", 4)
            per_line = n if (n := whole_number(width)) is not None else len(str(width))
            _check_len(len(text) + (text.count("\n") + 1) * max(per_line or 0, 0))
        elif name == "wordwrap" and text is not None:
            width = whole_number(_arg(args, kwargs, 0, "width", 79)) or 1
            wrap = _arg(args, kwargs, 2, "wrapstring") or "\n"
            lines = len(text) // max(width, 1) + text.count("\n") + 1
            _check_len(len(text) + lines * len(str(wrap)))
        elif name == "format":
            _check_percent(value, args or dict(kwargs))
        elif name == "replace":
            _check_replace(value, _arg(args, kwargs, 0, "old"), _arg(args, kwargs, 1, "new"))
        elif name == "join" and "attribute" not in kwargs and len(args) < 2:
            all_args = (*all_args[:skip], _joined(_arg(args, kwargs, 0, "d", ""), value), *args)
        return _check_result(fn(*all_args, **kwargs))

    return guarded


_PADDING_METHODS = frozenset({"center", "ljust", "rjust", "zfill"})
_REFUSED_METHODS = frozenset({"translate", "maketrans"})


class _Bound(NodeTransformer):
    """Rewrites a parsed template so loops, ``~`` and comparisons go through the environment's
    bounded helpers (which a template cannot name, so a record field cannot shadow them)."""

    @staticmethod
    def _call(helper: str, args: list[Any], lineno: int) -> nodes.Call:
        return nodes.Call(nodes.EnvironmentAttribute(helper), args, [], None, None, lineno=lineno)

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = self._call("bounded_iter", [node.iter], node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return self._call("bounded_concat", list(node.nodes), node.lineno)

    def visit_Getitem(self, node: nodes.Getitem) -> nodes.Node:
        self.generic_visit(node)
        if not isinstance(node.arg, nodes.Slice):
            return node
        bounds = [
            x if x is not None else nodes.Const(None) for x in (node.arg.start, node.arg.stop, node.arg.step)
        ]
        return self._call("bounded_slice", [node.node, *bounds], node.lineno)

    def visit_Compare(self, node: nodes.Compare) -> nodes.Node:
        self.generic_visit(node)
        node.expr = self._call("bounded_value", [node.expr], node.lineno)
        for operand in node.ops:
            operand.expr = self._call("bounded_value", [operand.expr], node.lineno)
        return node


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """Jinja2's immutable sandbox with the limits of this module (see its docstring). Render with
    :func:`render`: it sets the per-rendering budget and streams the output up to the limit."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, **options: Any) -> None:
        super().__init__(finalize=self._finalize, **options)
        self.globals.pop("lipsum", None)  # lipsum(n=…) writes n paragraphs
        self.filters = {name: _guard_filter(name, fn) for name, fn in self.filters.items()}
        self._helpers = {
            getattr(BoundedSandbox, name)
            for name in ("bounded_iter", "bounded_concat", "bounded_slice", "bounded_value")
        }

    # ----------------------------------------------------------------- rewritten template nodes
    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        bounded = _Bound().visit(tree)
        bounded.set_environment(self)
        return bounded  # type: ignore[no-any-return]

    def bounded_iter(self, iterable: Any) -> Iterator[Any]:
        """What a ``{% for %}`` loops over: every iteration is a step."""
        _check_value(iterable)
        for item in iterable:
            _step()
            yield item

    def bounded_concat(self, *parts: Any) -> str:
        """``a ~ b``: the joined length is checked before joining."""
        size = 0
        for part in parts:
            size += len(part) if isinstance(part, str) else _measure(part, _current())[1]
        _check_len(size)
        return str(_check_result("".join(map(str, parts))))

    def bounded_slice(self, value: Any, start: Any, stop: Any, step: Any) -> Any:
        """``value[start:stop:step]`` (a copy, which counts as built)."""
        return _check_result(value[start:stop:step])

    def bounded_value(self, value: Any) -> Any:
        """An operand of a comparison: a container is measured first (comparing nested structures
        walks them; ``in`` scans text)."""
        _read(value)
        return _check_value(value)

    @staticmethod
    def concat(parts: Iterable[str]) -> str:
        """Joins captured output (macro bodies, ``{% set %}`` and ``{% filter %}`` blocks): the joined
        length is checked before joining."""
        parts = list(parts)
        _check_len(sum(len(p) for p in parts), "captured output")
        return str(_check_result("".join(parts)))

    @staticmethod
    def _finalize(value: Any) -> Any:
        """Every ``{{ … }}`` output: a container is measured as printed; the text counts as built."""
        _check_value(value, printed=True)
        if isinstance(value, str):
            _built(len(value))
        return value

    # ------------------------------------------------------------------------- sandbox hooks
    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, str | bytes | list | tuple) and whole_number(n) is not None:
                    _check_len(len(seq) * max(int(n), 0))
            if whole_number(left) is not None and whole_number(right) is not None:
                _check_int_bits(abs(left).bit_length() + abs(right).bit_length())
        elif operator == "**":
            if (
                whole_number(left) is not None
                and whole_number(right) is not None
                and right > 0
                and abs(left) > 1
            ):
                _check_int_bits(right * abs(left).bit_length())
        elif operator == "+":
            sequences = (str | bytes, list | tuple)
            if any(isinstance(left, kind) and isinstance(right, kind) for kind in sequences):
                _check_len(len(left) + len(right))
        elif operator == "%" and isinstance(left, str):
            _check_percent(left, right)
        return _check_result(super().call_binop(context, operator, left, right))

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(__obj, "__func__", None) in __self._helpers:
            return __obj(*args)
        _step()
        target: Any = getattr(__obj, "__self__", None)
        _read(target, *args, *kwargs.values())
        for v in (*args, *kwargs.values()):
            _check_value(v)
        name = getattr(__obj, "__name__", "")
        if isinstance(target, str | bytes):
            if name in _REFUSED_METHODS:
                raise SecurityError(f"str.{name} is not available in prompt templates")
            if name in _PADDING_METHODS:
                _check_width(_arg(args, kwargs, 0, "width"), "width")
            elif name == "expandtabs":
                tab = whole_number(_arg(args, kwargs, 0, "tabsize", 8)) or 0
                tabs = target.count("\t") if isinstance(target, str) else target.count(b"\t")
                _check_len(len(target) + tabs * tab)
            elif name == "replace" and len(args) >= 2:
                _check_replace(target, args[0], args[1], _arg(args, kwargs, 2, "count", -1))
            elif name == "join" and args:
                args = (_joined(target, args[0]), *args[1:])
        return _check_result(super().call(__context, __obj, *args, **kwargs))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None
        fmt = value.__self__

        @functools.wraps(wrapper)
        def guarded(*args: Any, **kwargs: Any) -> str:
            if value.__name__ == "format_map" and len(args) == 1 and isinstance(args[0], Mapping):
                _check_format(fmt, (), args[0])
            else:
                _check_format(fmt, args, kwargs)
            return str(_check_result(wrapper(*args, **kwargs)))

        return guarded


@functools.lru_cache(maxsize=1)
def _env() -> BoundedSandbox:
    return BoundedSandbox(undefined=StrictUndefined, autoescape=False, keep_trailing_newline=True)


@functools.lru_cache(maxsize=256)
def compile_template(source: str) -> Any:
    try:
        return _env().from_string(source)
    except TemplateError as exc:
        raise ConfigError(f"invalid prompt template: {exc}") from exc
    except (RecursionError, MemoryError) as exc:
        raise ConfigError(f"invalid prompt template: {type(exc).__name__}: too deeply nested") from exc


def render(source: str, variables: Mapping[str, Any], *, quick: bool = False) -> str:
    """``source`` rendered over ``variables`` within this module's limits; any failure, the limits
    included, is a :class:`PromptError`. ``quick``: within :data:`QUICK_LIMITS` (to run inline on an
    event loop), else :class:`OverQuickBudget`."""
    template = compile_template(source)
    token = _RENDER.set(_Render(quick))
    try:
        out: list[str] = []
        size = 0
        for chunk in template.generate(**variables):
            size += len(chunk)
            if size > MAX_PROMPT_CHARS:
                raise PromptError(f"prompt longer than {MAX_PROMPT_CHARS} characters")
            out.append(chunk)
        return "".join(out)
    except (PromptError, OverQuickBudget):
        raise
    except TemplateError as exc:
        raise PromptError(f"prompt template: {exc}") from exc
    except Exception as exc:  # a TypeError in an expression, RecursionError, MemoryError…: this record
        raise PromptError(f"prompt template: {type(exc).__name__}: {exc}") from exc
    finally:
        _RENDER.reset(token)


@functools.lru_cache(maxsize=256)
def variables_read(source: str) -> frozenset[str]:
    """The variables ``source`` reads from its context (those it does not set itself); a template
    that does not compile reads none (compiling it says why)."""
    from jinja2 import meta

    try:
        return frozenset(meta.find_undeclared_variables(_env().parse(source)))
    except TemplateError:
        return frozenset()
