"""The worker's HTTP/JSON API (FastAPI); docs/reference/worker.md describes the contract.

``/v1/health`` and ``/v1/ready`` are open (probes; ``/v1/ready`` tells why it is not ready only to a
caller with the token); everything else needs the bearer token unless
the worker runs with ``--insecure-no-auth`` on loopback. The token and the body size
(``--max-body-bytes``) are checked by :class:`~airflow_batchinfer.worker.guard.RequestGuard` before
FastAPI reads or parses anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse

from airflow_batchinfer.engines import Engine
from airflow_batchinfer.engines.adapters import Adapter
from airflow_batchinfer.engines.pooling import GENERATE, task_refusal
from airflow_batchinfer.exceptions import ConfigError, JobConflict, WorkerBusy
from airflow_batchinfer.rpc.models import (
    MAX_WAIT_S,
    REQUIRED_OUTPUTS,
    JobSpec,
    JobStatus,
    SleepAnswer,
    SleepRequest,
    WorkerStats,
)
from airflow_batchinfer.state.docs import read_job_manifest
from airflow_batchinfer.state.params import JobSetup, parse_params
from airflow_batchinfer.storage.ranges import InputRange, piece_uris
from airflow_batchinfer.worker import metrics
from airflow_batchinfer.worker.announce import mark, marks, model_source
from airflow_batchinfer.worker.config import WorkerConfig
from airflow_batchinfer.worker.guard import RequestGuard
from airflow_batchinfer.worker.registry import JobRegistry
from airflow_batchinfer.worker.runtime import Runtime
from airflow_batchinfer.worker.security import PrefixPolicy, model_allows, token_ok

log = logging.getLogger("airflow_batchinfer.worker")


class ApiError(Exception):
    def __init__(self, status: int, error: str, detail: str, headers: dict[str, str] | None = None) -> None:
        self.status, self.error, self.detail, self.headers = status, error, detail, headers


def _check_adapters(
    adapters: Iterable[Adapter], prefixes: PrefixPolicy, allowed: list[str], engine: Engine
) -> None:
    """A job's adapters, before it starts: the engine loads adapters, and each is a PEFT directory
    inside this worker's allowed prefixes or its allowed adapters (``--allow-adapter``, compared as
    real paths like models): every record would fail alike."""
    refused = engine.adapter_refusal()
    if refused is not None:
        raise ApiError(400, "bad_request", f"the job names LoRA adapters, but {refused}")
    for adapter in adapters:
        try:
            listed = any(model_allows(entry, adapter.path) for entry in allowed)
        except ValueError:
            listed = False
        if not listed and (reason := prefixes.why_not(adapter.path)) is not None:
            raise ApiError(
                403,
                "forbidden",
                f"adapter {adapter.name}: {reason}, and not among its allowed adapters "
                f"({allowed or 'none'}): start the workers with --allow-adapter for it (a DAG's pool: "
                "the deployment's allowed_adapters, or the DAG's default adapters)",
            )
        if not os.path.isfile(os.path.join(adapter.path, "adapter_config.json")):
            raise ApiError(
                400,
                "bad_request",
                f"adapter {adapter.name}: {adapter.path} holds no adapter_config.json on this worker: name "
                "a PEFT adapter directory (adapter_config.json and its weights) that the workers can read",
            )


def serving_refusal(kind: str, params: JobSetup, engine: Engine) -> str | None:
    """Why this worker's model cannot serve a job (``None``: it can): a scoring model generates
    nothing (an infer job, an llm judge), a generating one scores nothing (a model judge), a job's
    task needs the model it names (:func:`~airflow_batchinfer.engines.pooling.task_refusal`), and a
    model judge's ``model`` or ``label`` must be the worker's. Known once the model has loaded."""
    scoring = engine.scoring
    infers = kind in ("infer", "infer_judge", "in_place")
    if infers and (why := task_refusal(params.task, scoring, engine.embedding)) is not None:
        return why
    if infers and params.task == GENERATE and scoring is not None:
        return (
            f"this worker's model ({os.path.basename(scoring.path)}) is a scoring model (labels "
            f"{list(scoring.labels)}): it scores answers for reward and classifier judges, and generates "
            "none: run inference on a pool whose model generates"
        )
    if params.early_jury is not None and (why := params.early_jury.early_refusal(scoring)) is not None:
        return why
    return None if params.judge is None else params.judge.serving_refusal(scoring)


def create_app(
    config: WorkerConfig, runtime: Runtime, *, on_fatal: Callable[[], None] | None = None
) -> FastAPI:
    """The worker app. ``on_fatal`` is called when the engine cannot start (the process should exit
    non-zero, so a supervisor restarts it and shows why)."""
    if not config.insecure_no_auth and not config.token:
        raise ConfigError("the worker app needs a token unless insecure_no_auth (loopback only) is set")
    prefixes = PrefixPolicy(config.allowed_prefixes)
    # checked at submit below, and held by the registry while each job runs
    registry = JobRegistry(runtime, concurrency=config.concurrency, policy=prefixes)
    state: dict[str, Any] = {"load_error": None}
    lifespan = _lifespan(config, runtime, registry, state, on_fatal)
    app = FastAPI(title="airflow-batchinfer worker", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.registry = registry
    app.state.runtime = runtime
    app.state.load_state = state
    # Outside FastAPI's routing and body parsing: the token first, then a bounded body.
    app.add_middleware(
        RequestGuard,
        token=None if config.insecure_no_auth else config.token,
        max_body_bytes=config.max_body_bytes,
    )
    _add_error_handlers(app)
    _add_probe_routes(app, config, runtime, registry, state)
    _add_job_routes(app, config, runtime, registry, state, prefixes)
    _add_sleep_routes(app, runtime, registry, state)
    _add_stats_routes(app, runtime, registry)
    return app


def _lifespan(
    config: WorkerConfig,
    runtime: Runtime,
    registry: JobRegistry,
    state: dict[str, Any],
    on_fatal: Callable[[], None] | None,
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """The app's lifespan: the engine loads in the background (a load error is kept in ``state``
    for ``/v1/ready`` and submits); at shutdown the registry drains, then the engine closes."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async def load() -> None:
            try:
                await runtime.start()
                mark("engine")
                log.info("engine %s ready", runtime.describe())
            except Exception as exc:
                log.exception("engine failed to start")
                state["load_error"] = f"{type(exc).__name__}: {exc}"
                if on_fatal is not None:
                    on_fatal()

        loader = asyncio.create_task(load())
        try:
            yield
        finally:
            if not loader.done():
                loader.cancel()
            await registry.drain(config.drain_timeout_s)
            await runtime.close()

    return lifespan


def _add_error_handlers(app: FastAPI) -> None:
    """Errors as ``{"error", "detail"}`` bodies: the API's own, and a request that fails validation."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(
            {"error": exc.error, "detail": exc.detail}, status_code=exc.status, headers=exc.headers
        )

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        reasons = "; ".join(f"{'.'.join(map(str, e['loc'][1:]))}: {e['msg']}" for e in exc.errors())
        return JSONResponse({"error": "bad_request", "detail": reasons}, status_code=400)


def _add_probe_routes(
    app: FastAPI, config: WorkerConfig, runtime: Runtime, registry: JobRegistry, state: dict[str, Any]
) -> None:
    """``/v1/health`` (which process answers) and ``/v1/ready``."""
    # Which process answers: a pool client tells a worker's own address from one address that a
    # Service or load balancer spreads over several workers (whose job states it could not follow).
    instance = secrets.token_hex(8)

    @app.get("/v1/health")
    async def health() -> dict[str, str]:
        return {"status": "ok", "instance": instance}

    @app.get("/v1/ready")
    async def ready(request: Request) -> JSONResponse:
        if runtime.ready and not registry.draining:
            return JSONResponse({"ready": True})
        # Open for the probes, which need only the status: the reason (a load error names model
        # paths, options, hosts) is for callers with the token.
        authorized = token_ok(request.headers.get("authorization"), config.token or "")
        if not (config.insecure_no_auth or authorized):
            return JSONResponse({"ready": False}, status_code=503)
        reason = state["load_error"] or ("draining" if registry.draining else "loading the model")
        return JSONResponse({"ready": False, "reason": reason}, status_code=503)


def _add_job_routes(
    app: FastAPI,
    config: WorkerConfig,
    runtime: Runtime,
    registry: JobRegistry,
    state: dict[str, Any],
    prefixes: PrefixPolicy,
) -> None:
    """``/v1/jobs``: submit a job (checked against the prefixes, the callables and the engine),
    follow it (a long poll) and cancel it."""
    callables = config.callable_policy()

    @app.post("/v1/jobs", status_code=202, response_model=JobStatus)
    async def submit(spec: JobSpec) -> JSONResponse:
        missing = [name for name in REQUIRED_OUTPUTS[spec.kind] if name not in spec.outputs]
        if missing:
            raise ApiError(400, "bad_request", f"a {spec.kind} job needs outputs {missing}")
        for uri in [spec.input, *piece_uris(spec.params), *spec.outputs.values()]:
            reason = await asyncio.to_thread(prefixes.why_not, uri)  # realpath: file system calls
            if reason is not None:
                raise ApiError(403, "forbidden", reason)
        try:
            # off the loop: compiling templates, schemas and patterns takes time in the spec's size
            params = await asyncio.to_thread(
                parse_params, spec.kind, spec.params, callables=callables, engine=runtime.engine.name
            )
            if (rng := spec.params.get("input_range")) is not None:  # its pieces: parts of its input
                InputRange.from_params(rng, root=spec.input)
        except (ConfigError, ValueError) as exc:
            raise ApiError(400, "bad_request", str(exc)) from exc
        if params.adapters:
            await asyncio.to_thread(
                _check_adapters, params.adapters.values(), prefixes, config.allowed_adapters, runtime.engine
            )
        if not runtime.ready:
            raise ApiError(
                503, "not_ready", state["load_error"] or "the model is still loading", {"Retry-After": "5"}
            )
        if (refused := serving_refusal(spec.kind, params, runtime.engine)) is not None:
            raise ApiError(400, "bad_request", refused)
        known = registry.status(spec.job_id)
        if known is not None and known.state == "succeeded":
            manifest = spec.outputs["manifest"]
            if await asyncio.to_thread(read_job_manifest, manifest, runtime.storage_options) is None:
                registry.forget(spec.job_id)  # its outputs were removed since (a close found them gone)
        try:
            status, created = registry.submit(spec, params)
        except JobConflict as exc:
            raise ApiError(409, "conflict", str(exc)) from exc
        except WorkerBusy as exc:
            code = 503 if registry.draining else 429
            raise ApiError(
                code, "busy" if code == 429 else "draining", str(exc), {"Retry-After": "2"}
            ) from exc
        if created:  # it runs now: no pending sleep, and a sleeping engine starts waking
            runtime.sleeper.job_arrived()
        return JSONResponse(status.model_dump(), status_code=202 if created else 200)

    @app.get("/v1/jobs/{job_id:path}", response_model=JobStatus)
    async def job_status(job_id: str, wait_s: float = 0.0) -> JobStatus:
        # A long poll: a follower learns of the job's end when it happens, not a poll interval later.
        status = await registry.wait(job_id, min(max(wait_s, 0.0), MAX_WAIT_S))
        if status is None:
            raise ApiError(404, "not_found", f"no job {job_id} on this worker")
        return status

    @app.delete("/v1/jobs/{job_id:path}", response_model=JobStatus)
    async def cancel(job_id: str) -> JobStatus:
        status = registry.cancel(job_id)
        if status is None:
            raise ApiError(404, "not_found", f"no job {job_id} on this worker")
        return status


def _add_sleep_routes(app: FastAPI, runtime: Runtime, registry: JobRegistry, state: dict[str, Any]) -> None:
    """``/v1/sleep`` (free the device once idle) and ``/v1/wake``
    (:mod:`~airflow_batchinfer.worker.sleep`)."""
    sleeper = runtime.sleeper

    def idle_since() -> float | None:
        return None if registry.busy else registry.last_activity

    @app.post("/v1/sleep", response_model=SleepAnswer)
    async def sleep(ask: SleepRequest) -> SleepAnswer:
        if not runtime.ready:
            raise ApiError(
                503, "not_ready", state["load_error"] or "the model is still loading", {"Retry-After": "5"}
            )
        try:
            if ask.after_s == 0 and idle_since() is not None:  # idle now: asleep when it answers
                await sleeper.sleep_now(ask.level)
            else:
                sleeper.ask(ask.level, ask.after_s, idle_since)
        except ConfigError as exc:
            raise ApiError(409, "sleep_refused", str(exc)) from exc
        return SleepAnswer(
            level=ask.level, after_s=ask.after_s, sleeping=sleeper.sleeping, pending=sleeper.pending
        )

    @app.post("/v1/wake")
    async def wake() -> dict[str, float]:
        return {"woke_s": await sleeper.wake()}


def _add_stats_routes(app: FastAPI, runtime: Runtime, registry: JobRegistry) -> None:
    """``/v1/stats`` (the slots, the jobs, the batcher) and ``/metrics`` (Prometheus)."""

    @app.get("/v1/stats", response_model=WorkerStats)
    async def stats() -> WorkerStats:
        return WorkerStats(
            engine=runtime.describe(),
            slots_total=registry.concurrency,
            slots_busy=registry.busy,
            draining=registry.draining,
            jobs=registry.state_counts(),
            batcher=runtime.batcher.stats.as_dict(),
            model_source=model_source(),
            started=marks(),
            sleeping=runtime.sleeper.sleeping,
            sleep_refusal=runtime.sleeper.refusal(1),
        )

    @app.get("/metrics")
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(registry), media_type="text/plain; version=0.0.4")
