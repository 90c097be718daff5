"""The package's layers, read from its source: every module-level import goes down the blocks of
:data:`LAYERS`, nothing below the Airflow layer imports it or, at module level, Airflow itself (the
review desk: not at all), and no two modules import each other.

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

# The package's blocks, lowest first (docs/architecture.md): a module imports, at module level, only
# modules of its own block or of a block listed before it. Lazy imports inside functions may reach up
# (a CLI command loads its engine), but never close a cycle (below).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("exceptions", "compat", "values", "progress", "charts", "lazy", "fields"),  # plain values and errors
    ("storage",),  # core: pure, worker-safe
    ("batching",),
    ("engines",),
    ("prompts",),
    ("judges",),
    ("state",),  # what a run root holds: the contract between worker, rpc, run and review
    ("rpc",),
    ("worker",),
    ("pools",),
    ("spec",),  # control plane: Airflow-free
    ("review",),
    ("run",),
    ("hooks",),  # the Airflow layer
    ("triggers",),
    ("assets",),  # the results asset: the report's and the close's outlets, the factory's
    ("operators",),
    ("dag_factory", "plugin", "get_provider_info"),
    ("dev", "demo", "cli"),
)
AIRFLOW_LAYER = LAYERS.index(("hooks",))


def block(name: str) -> int:
    """The index in :data:`LAYERS` of the block a package module belongs to."""
    top = name.removeprefix(PACKAGE).lstrip(".").partition(".")[0]
    for i, layer in enumerate(LAYERS):
        if top in layer:
            return i
    raise AssertionError(f"{name}: in no block of LAYERS; add its top-level name there")


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


def _module_level(tree: ast.Module) -> ast.Module:
    """``tree`` without function and class bodies: what importing the module runs."""
    keep = [n for n in tree.body if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)]
    return ast.Module(body=keep, type_ignores=[])


@functools.cache
def direct_imports(module_level: bool = False) -> dict[str, frozenset[str]]:
    """Per package module, the package modules it names in an import (at module level only, or
    anywhere)."""
    out = {}
    for name, path in modules().items():
        tree = ast.parse(path.read_text(), str(path))
        found = _imports(_module_level(tree) if module_level else tree, name, path.name == "__init__.py")
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
    assert f"{PACKAGE}.state.params" in imports[f"{PACKAGE}.state.config"]  # inside a method only
    source = "if TYPE_CHECKING:\n    import a\nelse:\n    import b\ndef f():\n    from .c import d\n"
    assert list(_imports(ast.parse(source), "p.m", False)) == ["b", "p.c.d"]
    ring = {"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}), "d": frozenset({"a"})}
    assert cycles(ring) == [["a", "b", "c"]]


def test_no_import_cycle_between_the_package_modules() -> None:
    found = cycles(graph())
    assert found == [], f"import cycles (lazy imports included): {found}"


def test_every_module_level_import_goes_down_the_layers() -> None:
    up = {
        name: sorted(t for t in targets if t != PACKAGE and block(t) > block(name))
        for name, targets in direct_imports(module_level=True).items()
        if name != PACKAGE
    }
    assert {k: v for k, v in up.items() if v} == {}, "imports of a block listed later (LAYERS)"


def test_nothing_below_the_airflow_layer_imports_it_even_lazily() -> None:
    airflow_side = {m for m in modules() if m != PACKAGE and block(m) >= AIRFLOW_LAYER}
    bad = {
        name: sorted(targets & airflow_side)
        for name, targets in direct_imports().items()
        if name != PACKAGE and block(name) < AIRFLOW_LAYER
    }
    assert {k: v for k, v in bad.items() if v} == {}


def airflow_imports(name: str, module_level: bool) -> list[str]:
    """The names of the ``airflow`` distribution that a package module imports."""
    path = modules()[name]
    tree = ast.parse(path.read_text(), str(path))
    found = _imports(_module_level(tree) if module_level else tree, name, path.name == "__init__.py")
    return sorted(n for n in found if n == "airflow" or n.startswith("airflow."))


def test_nothing_below_the_airflow_layer_imports_airflow_at_module_level() -> None:
    """Importing the control plane (and the worker, the core) loads no Airflow: a base module that
    must touch it (compat's exceptions, a task's ``AirflowFailException``) does so on first use."""
    below = [m for m in modules() if m != PACKAGE and block(m) < AIRFLOW_LAYER]
    bad = {name: found for name in below if (found := airflow_imports(name, module_level=True))}
    assert bad == {}


def test_the_review_desk_imports_no_airflow_even_lazily() -> None:
    """The desk's routes take what they need of Airflow from the plugin (plugin/desk.py)."""
    review = [m for m in modules() if within(m, ("review",))]
    assert f"{PACKAGE}.review.app" in review
    bad = {name: found for name in review if (found := airflow_imports(name, module_level=False))}
    assert bad == {}


def test_the_scanner_sees_airflow_imports() -> None:
    assert airflow_imports(f"{PACKAGE}.plugin.desk", module_level=True)
    assert not airflow_imports(f"{PACKAGE}.compat", module_level=True)
    assert "airflow.__version__" in airflow_imports(f"{PACKAGE}.compat", module_level=False)


def test_every_block_is_a_package_or_a_module() -> None:
    names = {n for layer in LAYERS for n in layer}
    tops = {p.stem if p.suffix else p.name for p in ROOT.iterdir() if p.name != "__init__.py"}
    tops = {t for t in tops if not t.startswith(("_", "."))}
    assert tops - {"__pycache__", "py"} <= names | {"py"}, "a top-level module in no block"
    assert all((ROOT / n).is_dir() or (ROOT / f"{n}.py").is_file() for n in names)


def test_the_scanner_sees_only_module_level_imports_when_asked() -> None:
    source = "import a\ndef f():\n    import b\nclass C:\n    import c\n"
    assert list(_imports(_module_level(ast.parse(source)), "p.m", False)) == ["a"]
