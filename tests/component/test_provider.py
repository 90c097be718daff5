from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_batchinfer.get_provider_info import get_provider_info


def test_provider_info_matches_airflow_schema() -> None:
    airflow = pytest.importorskip("airflow", reason="needs the airflow extra")
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    assert info["package-name"] == "airflow-batchinfer"


@pytest.mark.airflow
def test_airflow_providers_list_shows_the_package(tmp_path: Path) -> None:
    pytest.importorskip("airflow", reason="needs the airflow extra")
    airflow = Path(sys.executable).parent / "airflow"
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path)}
    out = subprocess.run(
        [str(airflow), "providers", "list", "--output", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    providers = {p["package_name"]: p for p in json.loads(out.stdout[out.stdout.index("[") :])}
    assert providers["airflow-batchinfer"]["version"] == "0.1.0"
