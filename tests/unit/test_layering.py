"""The package's layers, read from its source: no import cycle, the worker side never imports the
Airflow side, and the review package reads only the run package's documents.

Every import counts, module-level or inside a function (a lazy import hides a cycle, it does not
remove it); importing ``a.b.c`` also runs ``a`` and ``a.b``. Imports under ``if TYPE_CHECKING:``
never run and are left out."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import airflow_batchinfer

PACKAGE = "airflow_batchinfer"
ROOT = Path(airflow_batchinfer.__file__).parent

# The worker side (no Airflow) and what it must not import.
LOWER = ("worker", "storage", "batching", "engines", "judges", "rpc")
UPPER = ("review", "pools", "operators", "triggers", "hooks", "dag_factory", "cli")
# What the review package may import of the run package: its documents (the run.docs package and
# its modules) and plain value modules.
REVIEW_READS = ("run", "run.docs", "run.layout", "run.config", "run.owner")
REVIEW_READS_WITHIN = ("run.docs",)


def module_name(path: Path) -> str:
    parts = [PACKAGE, *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def owner(name: str) -> str | None:
    """The package module ``name`` is, or is in (``a.b.C`` -> ``a.b``)."""
    mods = modules()
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def ancestors(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    """The dotted names one module imports, at any depth, but under ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _type_checking(node):
            yield from _imports(ast.Module(body=node.orelse, type_ignores=[]), module, is_package)
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package up
                package = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            yield from (f"{base}.{alias.name}" for alias in node.names)
        yield from _imports(node, module, is_package)


@functools.cache
def direct_imports() -> dict[str, frozenset[str]]:
    """Per package module, the package modules it names in an import."""
    out = {}
    for name, path in modules().items():
        found = _imports(ast.parse(path.read_text(), str(path)), name, path.name == "__init__.py")
        targets = {owner(n) for n in found if n == PACKAGE or n.startswith(PACKAGE + ".")}
        out[name] = frozenset(t for t in targets if t is not None and t != name)
    return out


@functools.cache
def graph() -> dict[str, frozenset[str]]:
    """What importing each module runs: its imports and their packages (but its own packages,
    which run before it)."""
    out = {}
    for name, targets in direct_imports().items():
        deps = {a for t in targets for a in {t, *ancestors(t)}} & modules().keys()
        out[name] = frozenset(deps - ancestors(name) - {name})
    return out


def cycles(edges: dict[str, frozenset[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def within(name: str, parts: tuple[str, ...]) -> bool:
    return any(name == f"{PACKAGE}.{p}" or name.startswith(f"{PACKAGE}.{p}.") for p in parts)


def test_the_scanner_sees_module_and_function_level_imports() -> None:
    imports = direct_imports()
    assert f"{PACKAGE}.run.settle" in imports[f"{PACKAGE}.run.close"]  # module level
    assert f"{PACKAGE}.worker.params" in imports[f"{PACKAGE}.run.config"]  # inside a method only
    source = "if TYPE_CHECKING:\n    import a\nelse:\n    import b\ndef f():\n    from .c import d\n"
    assert list(_imports(ast.parse(source), "p.m", False)) == ["b", "p.c.d"]
    ring = {"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}), "d": frozenset({"a"})}
    assert cycles(ring) == [["a", "b", "c"]]


def test_no_import_cycle_between_the_package_modules() -> None:
    found = cycles(graph())
    assert found == [], f"import cycles (lazy imports included): {found}"


def test_the_worker_side_imports_nothing_of_the_airflow_side() -> None:
    bad = {
        name: sorted(t for t in targets if within(t, UPPER))
        for name, targets in direct_imports().items()
        if within(name, LOWER)
    }
    assert {k: v for k, v in bad.items() if v} == {}


def test_the_review_package_reads_only_the_run_documents() -> None:
    allowed = {f"{PACKAGE}.{m}" for m in REVIEW_READS}
    allowed |= {m for m in modules() if within(m, REVIEW_READS_WITHIN)}
    bad = {
        name: sorted(t for t in targets if within(t, ("run",)) and t not in allowed)
        for name, targets in direct_imports().items()
        if within(name, ("review",))
    }
    assert {k: v for k, v in bad.items() if v} == {}


def test_only_a_gate_answer_applies_review_decisions_in_the_run_package() -> None:
    """The run package imports the review package only where a gate's answer applies the reviewers'
    decisions (the plan); nothing of a round's close does."""
    found = {
        (name, t)
        for name, targets in direct_imports().items()
        if within(name, ("run",))
        for t in targets
        if within(t, ("review",))
    }
    assert found <= {(f"{PACKAGE}.run.plan", f"{PACKAGE}.review.apply")}
