"""Pools in topologies they cannot serve, with real worker processes over real HTTP: one static
address that a balancer spreads over two workers is told from two workers' own addresses."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_batchinfer.pools.static import StaticPool
from airflow_batchinfer.rpc.pool import worker_instances
from tests.support.proxy import RoundRobinProxy
from tests.support.workers import TOKEN, WorkerProcess, start_worker

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[WorkerProcess]]:
    root = tmp_path_factory.mktemp("topology")
    workers = [start_worker(root / f"w{i}") for i in range(2)]
    try:
        yield workers
    finally:
        for w in workers:
            w.stop()


async def test_an_address_in_front_of_two_workers_shows_both(two_workers: list[WorkerProcess]) -> None:
    urls = [w.url for w in two_workers]
    own = await worker_instances(urls)
    assert all(len(own[u]) == 1 for u in urls) and own[urls[0]] != own[urls[1]]
    with RoundRobinProxy(urls) as proxy:
        shared = await worker_instances([proxy.url])
        assert shared[proxy.url] == own[urls[0]] | own[urls[1]]
    assert await worker_instances(["http://127.0.0.1:9"]) == {"http://127.0.0.1:9": set()}  # nobody there


async def test_the_readiness_check_refuses_the_shared_address_only(two_workers: list[WorkerProcess]) -> None:
    pytest.importorskip("airflow", reason="needs the airflow extra")
    from airflow_batchinfer.triggers.pool_ready import observe_pool, pool_readiness

    urls = [w.url for w in two_workers]
    own = await observe_pool(StaticPool(urls=urls, rpc_token=TOKEN), TOKEN)
    assert own.shared == () and pool_readiness(own, 2) == "ready"
    with RoundRobinProxy(urls) as proxy:
        obs = await observe_pool(StaticPool(urls=[proxy.url], rpc_token=TOKEN), TOKEN)
    assert obs.shared == (proxy.url,) and pool_readiness(obs, 1) == "refused"
