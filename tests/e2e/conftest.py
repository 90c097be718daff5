"""A real Airflow 3.3.2 for the end-to-end tests: api-server, scheduler, dag-processor and triggerer
as separate processes on 127.0.0.1 (SQLite, LocalExecutor), started once per session, stopped by PID.
Runs are triggered and reviews answered through the REST API only."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("airflow", reason="needs the airflow extra")

from airflow_batchinfer.local_airflow import LocalAirflow
from airflow_batchinfer.pools import LocalPool

DAGS = Path(__file__).parent / "dags"
POOL_SLOTS = 4  # = replicas (2) x concurrency (2) of the e2e DAGs' local pool


@pytest.fixture(scope="session")
def e2e_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("e2e")
    os.environ["BATCHINFER_E2E_ROOT"] = str(root)
    return root


@pytest.fixture(scope="session")
def airflow(e2e_root: Path) -> Iterator[LocalAirflow]:
    cache = e2e_root / "cache"
    af = LocalAirflow(
        home=e2e_root / "airflow",
        dags_folder=DAGS,
        parallelism=12,
        env={"BATCHINFER_E2E_ROOT": str(e2e_root), "BATCHINFER_CACHE": str(cache)},
    )
    try:
        af.start(pools={"e2e": POOL_SLOTS})
        for dag_id in ("e2e_rounds", "e2e_hybrid", "e2e_in_place", "e2e_review"):
            af.wait_for_dag(dag_id)
        yield af
    finally:
        af.stop()
        LocalPool("e2e", state_dir=cache / "pools").down()


def write_dataset(path: Path, n: int, prefix: str = "r") -> list[str]:
    ids = [f"{prefix}{i:04d}" for i in range(n)]
    with path.open("w") as f:
        for i, rid in enumerate(ids):
            f.write(json.dumps({"id": rid, "question": f"question {i}"}) + "\n")
    return ids
