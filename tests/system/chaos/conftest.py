"""The chaos suite's real world, started once per session: a SeaweedFS S3 server that tests may stop
and start again (same port, same data), and a real Airflow 3.3.2 (api-server, scheduler,
dag-processor, triggerer; SQLite, LocalExecutor) whose failure detection is fast (a task without
heartbeat for 10 s is failed and retried; a dead scheduler's or triggerer's work is taken over after
10 s). Workers are real ``batchinfer worker serve`` processes in local pools, started by the DAGs'
``pool_setup`` tasks; they reach S3 through the environment, Airflow through the AWS connection
``chaos_s3``. Everything listens on 127.0.0.1 and is stopped by PID at the end."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("airflow", reason="needs the airflow extra")

from airflow_batchinfer.dev.local_airflow import LocalAirflow
from airflow_batchinfer.pools import LocalPool
from tests.support.chaos import BUCKET, FAILURE_TIMEOUT_S
from tests.support.seaweedfs import S3Server, start_seaweedfs

DAGS = Path(__file__).parent / "dags"
DAG_IDS = ("chaos_rounds", "chaos_disk", "chaos_inline", "chaos_s3", "chaos_review", "chaos_gate")
POOL_SLOTS = 4  # = replicas (2) x concurrency (2) of the chaos DAGs' local pools
LOCAL_POOLS = ("chaos", "chaos-s3", "chaos-review", "chaos-retry", "chaos-triggerer", "chaos-gate")


@pytest.fixture(scope="session")
def chaos_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chaos")


# The S3 server and the Airflow below serve test_chaos.py alone: module-scoped, they stop (with the
# warm pools) before the later tiers start their own Airflow on the same 2 cores.
@pytest.fixture(scope="module")
def chaos_s3(chaos_root: Path) -> Iterator[S3Server]:
    server = start_seaweedfs(chaos_root / "seaweedfs", bucket=BUCKET)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def chaos_airflow(chaos_root: Path, chaos_s3: S3Server) -> Iterator[LocalAirflow]:
    cache = chaos_root / "cache"
    af = LocalAirflow(
        home=chaos_root / "airflow",
        dags_folder=DAGS,
        parallelism=12,
        preload=True,  # tasks fork with the DAG-building modules imported (dev/preloaded.py)
        failure_timeout_s=FAILURE_TIMEOUT_S,
        env={
            "BATCHINFER_CHAOS_ROOT": str(chaos_root),
            "BATCHINFER_CHAOS_BUCKET": BUCKET,
            "BATCHINFER_CACHE": str(cache),
            "AIRFLOW_CONN_CHAOS_S3": json.dumps(chaos_s3.airflow_connection()),
            **chaos_s3.env(),  # the workers' S3 credentials and endpoint
        },
    )
    try:
        af.start(pools={"chaos": POOL_SLOTS})
        for dag_id in DAG_IDS:
            af.wait_for_dag(dag_id)
        yield af
    finally:
        af.stop()
        for name in LOCAL_POOLS:
            LocalPool(name, state_dir=cache / "pools").down()


@pytest.fixture
def pools_dir(chaos_root: Path) -> Path:
    return chaos_root / "cache" / "pools"


os.environ.setdefault("OMP_NUM_THREADS", "1")
