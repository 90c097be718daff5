"""``batchinfer run``'s lane count (issue 24, item 2): ``lanes`` 0 runs one lane per job slot of
the pool, which the workers' ``/v1/stats`` tell; a pool none of whose workers answers is an error
with the remedy. Workers are answered by an injected transport (no sockets)."""

from __future__ import annotations

import httpx
import pytest

from airflow_batchinfer.exceptions import WorkerUnavailable
from airflow_batchinfer.rpc.pool import PoolClient
from airflow_batchinfer.run.pipeline import input_lanes, pool_slots
from airflow_batchinfer.state.config import RunConfig


def _pool(slots: dict[str, int | None]) -> PoolClient:
    """Workers ``url -> slots_total`` (``None``: the worker does not answer)."""

    def handler(request: httpx.Request) -> httpx.Response:
        url = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        total = slots[url]
        if total is None:
            raise httpx.ConnectError("connection refused", request=request)
        assert request.url.path == "/v1/stats"
        stats = {"engine": {}, "slots_total": total, "slots_busy": total, "draining": False, "jobs": {},
                 "batcher": {}}  # fmt: skip
        return httpx.Response(200, json=stats)

    return PoolClient(list(slots), token="t", transport=httpx.MockTransport(handler))


async def test_the_pool_slots_are_every_answering_workers_slots() -> None:
    pool = _pool({"http://w1:1": 3, "http://w2:1": 4, "http://w3:1": None})
    try:
        assert await pool_slots(pool) == 7  # busy slots count too: a lane waits for one
    finally:
        await pool.aclose()


async def test_a_pool_without_an_answering_worker_is_refused_with_the_remedy() -> None:
    pool = _pool({"http://w1:1": None})
    try:
        with pytest.raises(WorkerUnavailable, match=r"no worker of the pool answers /v1/stats.*set --lanes"):
            await pool_slots(pool)
    finally:
        await pool.aclose()


async def test_the_inputs_taper_is_for_the_lanes_round_0_runs() -> None:
    def cfg(lanes: int) -> RunConfig:
        return RunConfig.of(input="x", run_root="y", prompt_template="{{ q }}", judge={"type": "llm"},
                            lanes=lanes)  # fmt: skip

    pool = _pool({"http://w1:1": 3, "http://w2:1": 4})
    silent = _pool({"http://w1:1": None})
    try:
        assert await input_lanes(cfg(0), pool) == 7  # one per slot of the pool
        assert await input_lanes(cfg(0), silent) == 0  # no taper; the first round tells the pool is down
        assert await input_lanes(cfg(5), silent) == 5  # set: as the round runs them, the pool not asked
    finally:
        await pool.aclose()
        await silent.aclose()
