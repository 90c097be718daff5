"""The public API (issue 36, item 4; what importing loads, in a fresh interpreter: tests/component/
test_public_api_imports.py): ``airflow_batchinfer``'s ``__all__``, each name imported on first
use (PEP 562), so that importing the package loads nothing (no Airflow); and every package
``__init__`` of the tree lazy in the same way, so that importing one module of a package loads no
other module of it."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil
from pathlib import Path

import pytest

import airflow_batchinfer
import airflow_batchinfer.exceptions

ROOT = Path(airflow_batchinfer.__file__).parent
PACKAGES = sorted(
    ".".join(("airflow_batchinfer", *p.parent.relative_to(ROOT).parts)) for p in ROOT.rglob("__init__.py")
)
OPERATORS = {
    "ShardDatasetOperator",
    "PoolSetupOperator",
    "PoolTeardownOperator",
    "ShardLaneOperator",
    "JudgeLanesOperator",
    "RoundControllerOperator",
    "CloseRoundOperator",
    "PreflightOperator",
    "RunReportOperator",
}
needs_airflow = pytest.mark.skipif(importlib.util.find_spec("airflow") is None, reason="needs airflow")


def test_the_facade_names_the_factory_its_asset_settings_operators_limits_and_every_error() -> None:
    errors = {
        name
        for name, value in vars(airflow_batchinfer.exceptions).items()
        if isinstance(value, type)
        and issubclass(value, Exception)
        and value.__module__.endswith(".exceptions")
    }
    public = {"build_batch_inference_dag", "results_asset", "RunConfig", "TriggerLimits"} | OPERATORS | errors
    assert set(airflow_batchinfer.__all__) == public
    assert public <= set(dir(airflow_batchinfer))
    assert airflow_batchinfer.__version__
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        airflow_batchinfer.Nothing  # noqa: B018


@needs_airflow
@pytest.mark.parametrize("package", PACKAGES)
def test_every_export_resolves(package: str) -> None:
    module = importlib.import_module(package)
    submodules = {m.name for m in pkgutil.iter_modules(module.__path__)}
    # a submodule's name, once it is imported, would hide the export of the same name (lazy.py)
    assert not set(getattr(module, "__all__", ())) & submodules
    for name in getattr(module, "__all__", ()):
        assert name in dir(module), name
        value = getattr(module, name)
        if inspect.isclass(value) or inspect.isfunction(value):  # not a constant or a type alias
            assert value.__name__ == name, name
