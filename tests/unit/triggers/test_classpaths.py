"""Every trigger of the package serialises with a literal classpath (what the triggerer imports, and
what deferred tasks store in the database): written out, not derived from the class, and importing
to the class itself."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import textwrap

import pytest

pytest.importorskip("airflow", reason="needs the airflow extra")

from airflow.triggers.base import BaseTrigger

import airflow_batchinfer.triggers as triggers_pkg


def package_triggers() -> list[type[BaseTrigger]]:
    found = []
    for info in pkgutil.iter_modules(triggers_pkg.__path__, f"{triggers_pkg.__name__}."):
        module = importlib.import_module(info.name)
        found += [c for _, c in inspect.getmembers(module, inspect.isclass)
                  if issubclass(c, BaseTrigger) and c.__module__ == module.__name__]  # fmt: skip
    return found


def test_every_trigger_is_found() -> None:
    assert {c.__name__ for c in package_triggers()} == {"PoolReadyTrigger", "LaneTrigger"}


@pytest.mark.parametrize("cls", package_triggers(), ids=lambda c: c.__name__)
def test_the_classpath_is_a_literal_that_imports_to_the_class(cls: type[BaseTrigger]) -> None:
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls.serialize)))
    (returned,) = [n.value for n in ast.walk(tree) if isinstance(n, ast.Return)]
    assert isinstance(returned, ast.Tuple)
    first = returned.elts[0]
    assert isinstance(first, ast.Constant) and isinstance(first.value, str), (
        f"{cls.__name__}.serialize() must return its classpath as a string literal, not {ast.unparse(first)}"
    )
    module, _, name = first.value.rpartition(".")
    assert getattr(importlib.import_module(module), name) is cls
