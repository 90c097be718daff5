"""The production-shaped tier's world, started once per session (tests/support/deployment.py): PostgreSQL,
Redis, the CeleryExecutor and the FAB auth manager; an api-server, a scheduler, a dag-processor, two
triggerers and two Celery workers, each on a "host" of its own sharing no disk; input and run roots
on a SeaweedFS S3 server; static pools of real ``batchinfer worker serve`` processes on their own
ports. Connections, the Airflow pool and the people are made in the metadata database, through the
REST API and Airflow's CLI, as an operator of a deployment would; the hosts' environment holds the S3
server's credentials (as an instance role would), for a DAG without an AWS connection, whose lanes
run on the triggerers. Failure detection is fast (15 s).
Everything is stopped when the package's tests are done, so later tiers run without it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("airflow", reason="needs the airflow extra")
pytest.importorskip("airflow.providers.celery", reason="needs the celery extra")
pytest.importorskip("airflow.providers.fab", reason="needs the deployment-tests extra")

from tests.support.deployment import (
    BUCKET,
    FAILURE_TIMEOUT_S,
    DeployedAirflow,
    StaticPools,
    missing,
    start_deployment,
)
from tests.support.proxy import RoundRobinProxy
from tests.support.seaweedfs import S3Server, start_seaweedfs
from tests.support.workers import TOKEN, WorkerProcess, start_worker

DAGS = Path(__file__).parent / "dags"
DAG_IDS = ("deploy_review", "deploy_rounds", "deploy_deferred", "deploy_inline")
POOL_SLOTS = 8
FAST = {"approval_rate": 0.5, "latency_base_s": 0.05}
SLOW = {"approval_rate": 0.5, "latency_base_s": 45.0}  # a batch (one shard) takes 45 s: tasks defer
# the slow workers run two batches at once (as vLLM runs several): two shard jobs on one worker then
# take 45 s side by side, not 90 s, the second queued behind the first's batch
SLOW_BATCHES = ["--max-concurrent-batches", "2"]
REVIEWER_ROLE = "User"  # FAB's role with the DAGs' edit and HITL permissions
OUTSIDER_ROLE = "Outsider"  # may see DAGs, nothing of their HITL details


@pytest.fixture(scope="package")
def deploy_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if why := missing():
        pytest.skip(why)
    return tmp_path_factory.mktemp("deployment")


@pytest.fixture(scope="package")
def deploy_s3(deploy_root: Path) -> Iterator[S3Server]:
    server = start_seaweedfs(deploy_root / "seaweedfs", bucket=BUCKET)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="package")
def static_pools(deploy_root: Path, deploy_s3: S3Server) -> Iterator[StaticPools]:
    """Two pools of two workers each, run outside Airflow (as a team runs them on GPU hosts)."""
    started: list[WorkerProcess] = []

    def worker(name: str, engine: dict[str, float], extra: list[str] | None = None) -> WorkerProcess:
        w = start_worker(
            deploy_root / "workers" / name,
            engine_args=engine,
            concurrency=2,
            allow=[f"s3://{BUCKET}/"],
            extra=extra,
            env=deploy_s3.env(),
        )
        started.append(w)
        return w

    try:
        fast = [worker(f"fast-{i}", FAST) for i in range(2)]
        slow = [worker(f"slow-{i}", SLOW, SLOW_BATCHES) for i in range(2)]
        with RoundRobinProxy([w.url for w in fast]) as shared:
            yield StaticPools(fast, slow, shared)
    finally:
        for w in started:
            w.stop()


@pytest.fixture(scope="package")
def deployment(
    deploy_root: Path, deploy_s3: S3Server, static_pools: StaticPools
) -> Iterator[DeployedAirflow]:
    af = start_deployment(
        deploy_root / "airflow",
        DAGS,
        env={"BATCHINFER_DEPLOY_BUCKET": BUCKET, "AIRFLOW__CORE__PARALLELISM": "16", **deploy_s3.env()},
        failure_timeout_s=FAILURE_TIMEOUT_S,
    )
    try:
        # what an operator of the deployment makes, in the database: connections and the pool
        s3 = deploy_s3.airflow_connection()
        af.api(
            "POST",
            "/connections",
            json={
                "connection_id": "deploy_s3",
                "conn_type": "aws",
                "login": s3["login"],
                "password": s3["password"],
                "extra": json.dumps(s3["extra"]),
            },
        )
        for conn_id, urls in (
            ("deploy_static", [w.url for w in static_pools.fast]),
            ("deploy_slow", [w.url for w in static_pools.slow]),
            ("deploy_shared", [static_pools.shared.url]),
        ):
            af.api(
                "POST",
                "/connections",
                json={
                    "connection_id": conn_id,
                    "conn_type": "batchinfer_pool",
                    "host": ",".join(urls),
                    "password": TOKEN,
                },
            )
        af.api(
            "POST",
            "/pools",
            json={
                "name": "deploy",
                "slots": POOL_SLOTS,
                "include_deferred": True,
                "description": "batchinfer shard slots (deployment tier)",
            },
        )
        af.add_user("reviewer", REVIEWER_ROLE)
        af.add_role(OUTSIDER_ROLE, {"DAGs": ["can_read"], "Website": ["can_read"]})
        af.add_user("outsider", OUTSIDER_ROLE)
        for dag_id in DAG_IDS:
            af.wait_for_dag(dag_id)
        yield af
    finally:
        af.stop()


os.environ.setdefault("OMP_NUM_THREADS", "1")
