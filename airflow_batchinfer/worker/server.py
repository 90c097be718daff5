"""``batchinfer worker serve``: one process, one event loop, the model loaded once.

SIGTERM drains: the worker stops accepting jobs (503), lets running ones finish (in-place jobs
checkpoint if the drain timeout passes), then exits 0. A second SIGTERM/SIGINT exits at once.
With ``idle_ttl`` the worker drains itself after that long without jobs (local pools), unless its
``lease_file`` shows a run still holding the pool (a review gate may wait for hours between rounds).

With ``announce_file`` (local pools) the worker writes its announcement
(:mod:`~airflow_batchinfer.worker.announce`) the moment the engine is loaded and the socket listens:
its pool waits for that file, not for a poll interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import time
from types import FrameType

import uvicorn

from airflow_batchinfer.engines import create_engine
from airflow_batchinfer.engines.images import ImageLimits
from airflow_batchinfer.rpc.urls import http_url
from airflow_batchinfer.worker.announce import announce, mark, note_model_source
from airflow_batchinfer.worker.app import create_app
from airflow_batchinfer.worker.config import WorkerConfig
from airflow_batchinfer.worker.leases import PoolState
from airflow_batchinfer.worker.model_cache import cached_model
from airflow_batchinfer.worker.registry import JobRegistry
from airflow_batchinfer.worker.runtime import Runtime, freeze_startup_objects

log = logging.getLogger("airflow_batchinfer.worker")


class _DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, registry: JobRegistry, drain_timeout_s: float) -> None:
        super().__init__(config)
        self.registry = registry
        self.drain_timeout_s = drain_timeout_s
        self.loop: asyncio.AbstractEventLoop | None = None
        self._draining: asyncio.Task[None] | None = None
        self.listening = asyncio.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:  # uvicorn sets it once its socket accepts connections
            mark("listening")
            self.listening.set()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._draining is not None or self.loop is None:  # a second signal: stop now
            self.should_exit = True
            self.force_exit = True
            return
        log.info(
            "signal %s: draining (up to %.0f s) before exit", signal.Signals(sig).name, self.drain_timeout_s
        )
        self.loop.call_soon_threadsafe(self.start_drain)

    def start_drain(self) -> None:
        if self._draining is None:
            self._draining = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        await self.registry.drain(self.drain_timeout_s)
        self.should_exit = True


def _leased(lease_file: str | None) -> bool:
    """Whether the local pool's lease file keeps this worker: a live lease, or a release less than
    ``idle_ttl_s`` ago. A missing file means the pool was stopped or replaced."""
    if lease_file is None:
        return False
    try:
        with open(lease_file, encoding="utf-8") as f:
            state = PoolState.from_dict(json.load(f))
    except FileNotFoundError:
        return False
    except (OSError, ValueError, KeyError, TypeError) as exc:  # never exit on a file we cannot read
        log.warning("cannot read the lease file %s (%s): staying up", lease_file, exc)
        return True
    return not state.idle_expired(time.time())


async def _announce_when_ready(
    server: _DrainingServer, runtime: Runtime, config: WorkerConfig, url: str
) -> None:
    """Announce the worker the moment its engine is loaded and its socket listens (either may come
    first), then freeze the start-up objects: after the announcement, the collection delays no start."""
    await runtime.wait_ready()
    await server.listening.wait()
    if config.announce_file:
        announce(config.announce_file, url)
    freeze_startup_objects()


async def _watch(server: _DrainingServer, config: WorkerConfig) -> None:
    """Drain after ``idle_ttl`` without jobs and leases (checked while the engine loads too)."""
    while not server.should_exit:
        await asyncio.sleep(0.5)
        registry = server.registry
        idle_for = time.monotonic() - registry.last_activity
        if (
            config.idle_ttl_s is not None
            and registry.busy == 0
            and idle_for > config.idle_ttl_s
            and not await asyncio.to_thread(_leased, config.lease_file)
        ):
            log.info("idle for %.0f s (idle_ttl %.0f s): exiting", idle_for, config.idle_ttl_s)
            server.start_drain()
            return


def bound_socket(host: str, port: int) -> socket.socket:
    """The worker's socket, bound (uvicorn listens on it)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # TCP_NODELAY, which the accepted connections inherit: asyncio sets it only on sockets made with
    # proto=IPPROTO_TCP (this one has 0). Without it each answer's body waited for the client's
    # delayed ACK of its headers: ~40 ms per request on a kept-alive connection (every poll).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    return sock


def serve(config: WorkerConfig) -> None:
    mark("imports")  # the CLI imports this module only for `worker serve`: its imports are done
    config.validate()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if config.allowed_prefixes is None:
        log.warning("--allow-any-prefix: jobs may read and write any storage location this worker can reach")
    if config.insecure_no_auth:
        log.warning("--insecure-no-auth: the RPC API is open to every local process")
    model, source = cached_model(config.model, config.model_cache_dir)
    if config.model:
        note_model_source(source)
        log.info(
            "loading the model from %s (%s)", model, "the node-local cache" if source == "cache" else source
        )
    engine = create_engine(config.engine, model=model, **config.engine_options, **config.engine_secrets)
    concurrent = config.max_concurrent_batches or (4 if config.engine == "vllm" else 1)
    runtime = Runtime(
        engine,
        target_batch_tokens=config.target_batch_tokens,
        max_batch_size=config.max_batch_size,
        batch_timeout_s=config.batch_timeout_s,
        max_concurrent_batches=concurrent,
        storage_options=config.storage_options,
        image_limits=ImageLimits(
            config.max_image_bytes,
            config.max_image_pixels,
            config.max_images_per_request,
            config.max_image_bytes_per_request,
        ),
    )
    server: _DrainingServer | None = None
    app = create_app(config, runtime, on_fatal=lambda: server.start_drain() if server else None)
    mark("app")
    sock = bound_socket(config.host, config.port)
    host, port = sock.getsockname()[:2]
    url = http_url(host, port)
    # host:port names this worker in job statuses and manifests: local pools run several per host.
    # $HOSTNAME first: in a container it is the pod's name (what `kubectl logs` takes).
    app.state.registry.worker_name = f"{os.environ.get('HOSTNAME') or socket.gethostname()}:{port}"
    # ws="none": the API has no websocket route, so the server need not import a websockets library
    uv_config = uvicorn.Config(
        app, log_level="warning", access_log=False, timeout_graceful_shutdown=5, ws="none"
    )
    server = _DrainingServer(uv_config, app.state.registry, config.drain_timeout_s)
    log.info("worker listening on %s (engine %s, concurrency %d)", url, config.engine, config.concurrency)

    async def main() -> None:
        server.loop = asyncio.get_running_loop()
        tasks = [
            asyncio.create_task(_announce_when_ready(server, runtime, config, url)),
            asyncio.create_task(_watch(server, config)),
        ]
        try:
            await server.serve(sockets=[sock])
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if config.announce_file:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(config.announce_file)

    asyncio.run(main())
    if app.state.load_state["load_error"]:
        raise SystemExit(f"worker stopped: the engine failed to start: {app.state.load_state['load_error']}")
