"""End-to-end tests on a real Airflow 3.3.2 (the ``airflow`` fixture below). Runs are triggered and
reviews answered through the REST API only.

The Airflow is package-scoped: it starts with the first test of this folder that needs it and stops
when the folder's tests are done, so the later tiers do not share the two cores with an idle Airflow
(its scheduler and dag-processor poll all the time). Every test that needs it lives here, the
security test of what a trigger may not choose included."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.e2e import E2E_MAX_MAP_LENGTH, JUDGE_POOL_SLOTS, POOL_SLOTS

pytest.importorskip("airflow", reason="needs the airflow extra")

E2E_DAGS = Path(__file__).parent / "dags"


@pytest.fixture(scope="package")
def e2e_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The e2e DAGs' root (``BATCHINFER_E2E_ROOT``, also read by the DAG files a test imports), unset
    again when this folder's tests are done."""
    root = tmp_path_factory.mktemp("e2e")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BATCHINFER_E2E_ROOT", str(root))
        yield root


@pytest.fixture(scope="package")
def airflow(e2e_root: Path) -> Iterator[Any]:
    """A real Airflow 3.3.2 for the end-to-end tests: api-server, scheduler, dag-processor and
    triggerer on 127.0.0.1 (SQLite, LocalExecutor), started once for this folder, stopped by PID; the
    DAGs of tests/system/e2e/dags."""
    from airflow_batchinfer.dev.local_airflow import LocalAirflow
    from airflow_batchinfer.pools import LocalPool

    cache = e2e_root / "cache"
    af = LocalAirflow(
        home=e2e_root / "airflow",
        dags_folder=E2E_DAGS,
        parallelism=12,
        preload=True,  # tasks fork with the DAG-building modules imported (dev/preloaded.py)
        env={
            "BATCHINFER_E2E_ROOT": str(e2e_root),
            "BATCHINFER_CACHE": str(cache),
            "AIRFLOW__CORE__MAX_MAP_LENGTH": str(E2E_MAX_MAP_LENGTH),
        },
    )
    try:
        af.start(pools={"e2e": POOL_SLOTS, "e2e_judge": JUDGE_POOL_SLOTS})
        for dag_id in (
            "e2e_rounds",
            "e2e_hybrid",
            "e2e_review",
            "e2e_judge_pool",
            "e2e_lanes",
            "e2e_downstream",
        ):
            af.wait_for_dag(dag_id)
        yield af
    finally:
        af.stop()
        for name in ("e2e", "e2e-judge", "e2e-lanes"):
            LocalPool(name, state_dir=cache / "pools").down()
