"""A package's exports, imported on first use (PEP 562), so that importing one module of a package
loads no other module of it.

A package ``__init__`` lists what it offers (``__all__``, which linters and ``import *`` read) and
the module each name lives in, and takes its ``__getattr__`` and ``__dir__`` from :func:`exports`::

    if TYPE_CHECKING:  # what type checkers and readers see
        from airflow_batchinfer.pools.local import LocalPool

    __all__ = ["LocalPool"]
    __getattr__, __dir__ = exports(__name__, __all__, {"local": ("LocalPool",)})

A name that is also a submodule's (``storage.recompact``) is not exported: once the submodule is
imported, Python binds its name on the package, which would then hide the lazy export.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def exports(
    package: str, names: Iterable[str], where: Mapping[str, Iterable[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: each name of ``where``'s values is imported
    from ``package.<key>`` (``key`` relative to ``package``) when first asked for. ``names`` (the
    package's ``__all__``) must be exactly those names: a name listed in one place only is refused
    here, as the package is imported."""
    module_of = {name: module for module, found in where.items() for name in found}
    if sorted(names) != sorted(module_of):
        raise ImportError(
            f"{package}: __all__ and the lazy exports differ: {sorted(set(names) ^ set(module_of))}"
        )

    def __getattr__(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *module_of})

    return __getattr__, __dir__
