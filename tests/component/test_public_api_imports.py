"""What importing the public API and the package's packages loads, each in a fresh interpreter: the
package loads nothing else (no Airflow), and importing a package loads none of its modules (every
``__init__`` exports lazily: airflow_batchinfer/lazy.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import airflow_batchinfer

ROOT = Path(airflow_batchinfer.__file__).parent
PACKAGES = sorted(
    ".".join(("airflow_batchinfer", *p.parent.relative_to(ROOT).parts)) for p in ROOT.rglob("__init__.py")
)


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_importing_the_package_loads_nothing_else() -> None:
    code = "import sys, airflow_batchinfer\nprint(sorted(m for m in sys.modules if m.startswith('airflow')))"
    assert _run(code) == "['airflow_batchinfer', 'airflow_batchinfer.lazy']"
    code = (
        "import sys\nfrom airflow_batchinfer import RunConfig, ConfigError, TriggerLimits\n"
        "print([m for m in sys.modules if m.split('.')[0] == 'airflow'])"
    )
    assert _run(code) == "[]"  # the settings, the limits and the errors import without Airflow


def test_importing_a_package_loads_none_of_its_modules() -> None:
    code = (
        "import importlib, json, sys\nLAZY = 'airflow_batchinfer.lazy'  # the helper of every lazy package\n"
        f"found = {{}}\nfor package in {PACKAGES!r}:\n"
        "    for m in [m for m in sys.modules if m.startswith('airflow_batchinfer.')]:\n"
        "        del sys.modules[m]\n"
        "    importlib.import_module(package)\n"
        "    found[package] = sorted(m for m in sys.modules if m.startswith(package + '.') and m != LAZY)\n"
        "print(json.dumps(found))"
    )
    assert {p: mods for p, mods in json.loads(_run(code)).items() if mods} == {}
