"""Worker RPC clients (httpx): async :class:`WorkerClient` and sync :class:`SyncWorkerClient`.

HTTP errors map to the exception tree (``WorkerBusy`` for 429/503, ``AuthenticationError`` 401,
``ForbiddenError`` 403, ``BadJobError`` 400 and 413, ``JobNotFound`` 404, ``SleepRefused`` a 409 of
``/v1/sleep``, ``WorkerUnavailable`` when the worker cannot be reached). Pass ``transport=`` (e.g.
``httpx.MockTransport``) to test without sockets.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import httpx

from airflow_batchinfer.exceptions import (
    AuthenticationError,
    BadJobError,
    ForbiddenError,
    JobNotFound,
    RpcError,
    SleepRefused,
    WorkerBusy,
    WorkerUnavailable,
)
from airflow_batchinfer.rpc.models import JobSpec, JobStatus, SleepAnswer, WorkerStats

_ERRORS: dict[int, type[RpcError]] = {
    400: BadJobError,
    401: AuthenticationError,
    403: ForbiddenError,
    404: JobNotFound,
    413: BadJobError,  # a request body over the worker's --max-body-bytes
    429: WorkerBusy,
    503: WorkerBusy,
}


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _check(response: httpx.Response, base_url: str) -> Any:
    if response.status_code < 300:
        return response.json()
    try:
        body = response.json()
        detail = f"{body.get('error')}: {body.get('detail')}"
    except ValueError:
        body, detail = None, response.text[:300]
    if response.status_code == 409 and isinstance(body, dict) and body.get("error") == "sleep_refused":
        reason = str(body.get("detail"))
        raise SleepRefused(f"worker {base_url} cannot sleep: {reason}", reason)
    cls = _ERRORS.get(response.status_code, RpcError)
    raise cls(f"worker {base_url} answered {response.status_code} ({detail})")


# A sleep or wake answers once the engine has moved its weights (level 1: tens of GiB to or from CPU
# memory; a level-2 wake reloads the model): longer than a job call's default timeout.
SLEEP_TIMEOUT_S = 900.0


def _sleep_body(level: int, after_s: float) -> dict[str, Any]:
    """``POST /v1/sleep``'s body (the worker checks it: a bad level answers 400)."""
    return {"level": level, "after_s": after_s}


class WorkerClient:
    """Async client for one worker."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=_headers(token),
            timeout=timeout,
            transport=transport,
            trust_env=False,
        )

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise WorkerUnavailable(
                f"worker {self.base_url} unreachable: {type(exc).__name__}: {exc}"
            ) from exc
        return _check(response, self.base_url)

    async def submit(self, spec: JobSpec) -> JobStatus:
        return JobStatus.model_validate(await self._call("POST", "/v1/jobs", json=spec.model_dump()))

    async def status(self, job_id: str, *, timeout: float | None = None, wait_s: float = 0.0) -> JobStatus:
        """The job's status; with ``wait_s``, once it ends or ``wait_s`` later (a long poll; a worker
        that predates it answers at once)."""
        extra: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        if wait_s > 0:
            extra = {"params": {"wait_s": round(wait_s, 3)}, "timeout": (timeout or 30.0) + wait_s}
        return JobStatus.model_validate(await self._call("GET", f"/v1/jobs/{job_id}", **extra))

    async def cancel(self, job_id: str) -> JobStatus:
        return JobStatus.model_validate(await self._call("DELETE", f"/v1/jobs/{job_id}"))

    async def stats(self) -> WorkerStats:
        return WorkerStats.model_validate(await self._call("GET", "/v1/stats"))

    async def sleep(
        self, level: int = 1, after_s: float = 0.0, *, timeout: float = SLEEP_TIMEOUT_S
    ) -> SleepAnswer:
        """Free the worker's device at ``level`` once it has been idle ``after_s`` (``POST /v1/sleep``;
        with ``after_s`` 0 on an idle worker it answers once asleep); raises
        :class:`~airflow_batchinfer.exceptions.SleepRefused` where its engine cannot."""
        body = _sleep_body(level, after_s)
        return SleepAnswer.model_validate(await self._call("POST", "/v1/sleep", json=body, timeout=timeout))

    async def wake(self, *, timeout: float = SLEEP_TIMEOUT_S) -> float:
        """Wake the worker's engine (a pending sleep dropped): the seconds the wake took (0: awake)."""
        return float((await self._call("POST", "/v1/wake", timeout=timeout))["woke_s"])

    async def instance(self) -> str | None:
        """The id of the worker process that answers (``/v1/health``; ``None`` from a worker that
        predates it)."""
        instance = (await self._call("GET", "/v1/health")).get("instance")
        return None if instance is None else str(instance)

    async def ready(self) -> bool:
        try:
            return bool((await self._call("GET", "/v1/ready")).get("ready"))
        except WorkerBusy:
            return False

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> WorkerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class SyncWorkerClient:
    """Blocking twin of :class:`WorkerClient` (operators' ``execute``, CLI)."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=_headers(token),
            timeout=timeout,
            transport=transport,
            trust_env=False,
        )

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise WorkerUnavailable(
                f"worker {self.base_url} unreachable: {type(exc).__name__}: {exc}"
            ) from exc
        return _check(response, self.base_url)

    def submit(self, spec: JobSpec) -> JobStatus:
        return JobStatus.model_validate(self._call("POST", "/v1/jobs", json=spec.model_dump()))

    def status(self, job_id: str) -> JobStatus:
        return JobStatus.model_validate(self._call("GET", f"/v1/jobs/{job_id}"))

    def cancel(self, job_id: str) -> JobStatus:
        return JobStatus.model_validate(self._call("DELETE", f"/v1/jobs/{job_id}"))

    def stats(self) -> WorkerStats:
        return WorkerStats.model_validate(self._call("GET", "/v1/stats"))

    def sleep(self, level: int = 1, after_s: float = 0.0, *, timeout: float = SLEEP_TIMEOUT_S) -> SleepAnswer:
        """As :meth:`WorkerClient.sleep`."""
        body = _sleep_body(level, after_s)
        return SleepAnswer.model_validate(self._call("POST", "/v1/sleep", json=body, timeout=timeout))

    def wake(self, *, timeout: float = SLEEP_TIMEOUT_S) -> float:
        """As :meth:`WorkerClient.wake`."""
        return float(self._call("POST", "/v1/wake", timeout=timeout)["woke_s"])

    def ready(self) -> bool:
        try:
            return bool(self._call("GET", "/v1/ready").get("ready"))
        except WorkerBusy:
            return False

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SyncWorkerClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
