"""The settings import without Airflow: checked in a fresh interpreter (the rest in
tests/unit/test_settings.py)."""

from __future__ import annotations

import subprocess
import sys


def test_the_settings_import_without_airflow() -> None:
    code = (
        "import sys, airflow_batchinfer.spec.settings as s; s.param_defaults(); s.param_schemas()\n"
        "print([m for m in sys.modules if m.split('.')[0] == 'airflow'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
