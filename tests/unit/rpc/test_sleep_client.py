"""The worker clients' ``sleep`` and ``wake`` (``httpx.MockTransport``): what they send, what they
return, and a refusal raised as ``SleepRefused`` with the worker's reason."""

from __future__ import annotations

import json

import httpx
import pytest

from airflow_batchinfer.exceptions import BadJobError, RpcError, SleepRefused
from airflow_batchinfer.rpc.client import SLEEP_TIMEOUT_S, SyncWorkerClient, WorkerClient

REASON = "vllm-cpu: sleep mode needs CUDA (...): use gate_idle keep or release"


def handler(request: httpx.Request) -> httpx.Response:
    # a sleep or wake waits for the engine to move its weights: longer than a job call's timeout
    assert request.extensions["timeout"]["read"] == SLEEP_TIMEOUT_S
    if request.url.path == "/v1/wake":
        return httpx.Response(200, json={"woke_s": 1.25})
    body = json.loads(request.content)
    if body["level"] == 2:
        return httpx.Response(409, json={"error": "sleep_refused", "detail": REASON})
    if body["level"] == 3:
        return httpx.Response(400, json={"error": "bad_request", "detail": "level: Input should be 1 or 2"})
    if body["level"] == 4:  # another 409 (a job id conflict, say) is no sleep refusal
        return httpx.Response(409, json={"error": "conflict", "detail": "x"})
    return httpx.Response(
        200, json={**body, "sleeping": body["after_s"] == 0, "pending": body["after_s"] > 0}
    )


def test_sync_client_sleeps_wakes_and_raises_the_refusal() -> None:
    with SyncWorkerClient("http://w", token="t", transport=httpx.MockTransport(handler)) as client:
        answer = client.sleep(1, 30.0)
        assert (answer.level, answer.after_s, answer.sleeping, answer.pending) == (1, 30.0, False, True)
        assert client.wake() == 1.25
        with pytest.raises(SleepRefused) as refused:
            client.sleep(2)
        assert refused.value.reason == REASON and "worker http://w cannot sleep: vllm-cpu" in str(
            refused.value
        )
        with pytest.raises(BadJobError, match="level"):
            client.sleep(3)
        with pytest.raises(RpcError) as other:
            client.sleep(4)
        assert not isinstance(other.value, SleepRefused)


async def test_async_client_the_same() -> None:
    async with WorkerClient("http://w", token="t", transport=httpx.MockTransport(handler)) as client:
        assert (await client.sleep(1)).sleeping is True
        assert await client.wake() == 1.25
        with pytest.raises(SleepRefused) as refused:
            await client.sleep(2, 5.0)
        assert refused.value.reason == REASON
