"""Prompt and judge templates: Jinja2 in a **bounded** sandbox (:class:`BoundedSandbox`), the immutable
sandbox plus limits on what one record's rendering may cost (the limits and their checks:
:mod:`~airflow_batchinfer.prompts.render_budget`). A template or record that goes past one is a
:class:`~airflow_batchinfer.exceptions.PromptError` for that record ("too large", "too many steps",
"prompt longer than …"), never a stalled worker or a failed job:

- the prompt is at most ``MAX_PROMPT_CHARS`` characters (rendering stops there);
- ``*``, ``**``, ``+`` and ``%`` refuse results larger than that (strings, lists) or integers over
  ``MAX_INT_BITS`` bits — before computing them; nothing is folded at compile time;
- loop iterations and calls (macros, methods, functions) count against ``MAX_RENDER_STEPS``, and
  one rendering stops after ``MAX_RENDER_SECONDS`` (work inside a filter, such as sorting, is not
  counted in steps: the clock and the ``MAX_ITEMS`` cap on containers bound it);
- padding, repeating and joining operations (``center``, ``indent``, ``wordwrap``, ``replace``,
  ``join``, format widths, ``tojson`` indents…) check the size of their result before building it;
- values made of nested lists/dicts are measured (shared parts counted each time they appear) before
  they are printed, compared, joined or filtered, so a structure doubled in a loop cannot explode.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from jinja2 import StrictUndefined, TemplateError, nodes
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

from airflow_batchinfer.exceptions import ConfigError, OverQuickBudget, PromptError
from airflow_batchinfer.prompts import render_budget as budget
from airflow_batchinfer.values import whole_number

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
        self.filters = {name: budget.guard_filter(name, fn) for name, fn in self.filters.items()}
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
        budget.check_value(iterable)
        for item in iterable:
            budget.step()
            yield item

    def bounded_concat(self, *parts: Any) -> str:
        """``a ~ b``: the joined length is checked before joining."""
        size = 0
        for part in parts:
            size += len(part) if isinstance(part, str) else budget.measure(part, budget.current())[1]
        budget.check_len(size)
        return str(budget.check_result("".join(map(str, parts))))

    def bounded_slice(self, value: Any, start: Any, stop: Any, step: Any) -> Any:
        """``value[start:stop:step]`` (a copy, which counts as built)."""
        return budget.check_result(value[start:stop:step])

    def bounded_value(self, value: Any) -> Any:
        """An operand of a comparison: a container is measured first (comparing nested structures
        walks them; ``in`` scans text)."""
        budget.read(value)
        return budget.check_value(value)

    @staticmethod
    def concat(parts: Iterable[str]) -> str:
        """Joins captured output (macro bodies, ``{% set %}`` and ``{% filter %}`` blocks): the joined
        length is checked before joining."""
        parts = list(parts)
        budget.check_len(sum(len(p) for p in parts), "captured output")
        return str(budget.check_result("".join(parts)))

    @staticmethod
    def _finalize(value: Any) -> Any:
        """Every ``{{ … }}`` output: a container is measured as printed; the text counts as built."""
        budget.check_value(value, printed=True)
        if isinstance(value, str):
            budget.built(len(value))
        return value

    # ------------------------------------------------------------------------- sandbox hooks
    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, str | bytes | list | tuple) and whole_number(n) is not None:
                    budget.check_len(len(seq) * max(int(n), 0))
            if whole_number(left) is not None and whole_number(right) is not None:
                budget.check_int_bits(abs(left).bit_length() + abs(right).bit_length())
        elif operator == "**":
            if (
                whole_number(left) is not None
                and whole_number(right) is not None
                and right > 0
                and abs(left) > 1
            ):
                budget.check_int_bits(right * abs(left).bit_length())
        elif operator == "+":
            sequences = (str | bytes, list | tuple)
            if any(isinstance(left, kind) and isinstance(right, kind) for kind in sequences):
                budget.check_len(len(left) + len(right))
        elif operator == "%" and isinstance(left, str):
            budget.check_percent(left, right)
        return budget.check_result(super().call_binop(context, operator, left, right))

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(__obj, "__func__", None) in __self._helpers:
            return __obj(*args)
        budget.step()
        target: Any = getattr(__obj, "__self__", None)
        budget.read(target, *args, *kwargs.values())
        for v in (*args, *kwargs.values()):
            budget.check_value(v)
        name = getattr(__obj, "__name__", "")
        if isinstance(target, str | bytes):
            if name in _REFUSED_METHODS:
                raise SecurityError(f"str.{name} is not available in prompt templates")
            if name in _PADDING_METHODS:
                budget.check_width(budget.arg(args, kwargs, 0, "width"), "width")
            elif name == "expandtabs":
                tab = whole_number(budget.arg(args, kwargs, 0, "tabsize", 8)) or 0
                tabs = target.count("\t") if isinstance(target, str) else target.count(b"\t")
                budget.check_len(len(target) + tabs * tab)
            elif name == "replace" and len(args) >= 2:
                budget.check_replace(target, args[0], args[1], budget.arg(args, kwargs, 2, "count", -1))
            elif name == "join" and args:
                args = (budget.joined(target, args[0]), *args[1:])
        return budget.check_result(super().call(__context, __obj, *args, **kwargs))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None
        fmt = value.__self__

        @functools.wraps(wrapper)
        def guarded(*args: Any, **kwargs: Any) -> str:
            if value.__name__ == "format_map" and len(args) == 1 and isinstance(args[0], Mapping):
                budget.check_format(fmt, (), args[0])
            else:
                budget.check_format(fmt, args, kwargs)
            return str(budget.check_result(wrapper(*args, **kwargs)))

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
    included, is a :class:`PromptError`. ``quick``: within ``render_budget.QUICK_LIMITS`` (to run inline on an
    event loop), else :class:`OverQuickBudget`."""
    template = compile_template(source)
    token = budget.RENDER.set(budget.Render(quick))
    try:
        out: list[str] = []
        size = 0
        for chunk in template.generate(**variables):
            size += len(chunk)
            if size > budget.MAX_PROMPT_CHARS:
                raise PromptError(f"prompt longer than {budget.MAX_PROMPT_CHARS} characters")
            out.append(chunk)
        return "".join(out)
    except (PromptError, OverQuickBudget):
        raise
    except TemplateError as exc:
        raise PromptError(f"prompt template: {exc}") from exc
    except Exception as exc:  # a TypeError in an expression, RecursionError, MemoryError…: this record
        raise PromptError(f"prompt template: {type(exc).__name__}: {exc}") from exc
    finally:
        budget.RENDER.reset(token)


@functools.lru_cache(maxsize=256)
def variables_read(source: str) -> frozenset[str]:
    """The variables ``source`` reads from its context (those it does not set itself); a template
    that does not compile reads none (compiling it says why)."""
    from jinja2 import meta

    try:
        return frozenset(meta.find_undeclared_variables(_env().parse(source)))
    except TemplateError:
        return frozenset()
