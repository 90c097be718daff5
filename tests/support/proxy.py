"""A round-robin TCP proxy on 127.0.0.1: one address in front of several workers, as a Kubernetes
Service or a load balancer puts it. Each new connection goes to the next backend."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections.abc import Sequence
from urllib.parse import urlsplit


class RoundRobinProxy:
    def __init__(self, backends: Sequence[str]) -> None:
        self.backends = [(u.hostname or "127.0.0.1", int(u.port or 80)) for u in map(urlsplit, backends)]
        self._next = itertools.cycle(self.backends)
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0
        self.connections = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()
        for writer in list(self._writers):  # open connections end with the proxy
            writer.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        self.connections += 1
        host, port = next(self._next)
        self._writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        self._writers.add(up_writer)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        with contextlib.suppress(OSError):
            await asyncio.gather(writer.wait_closed(), up_writer.wait_closed())
        self._writers -= {writer, up_writer}

    def __enter__(self) -> RoundRobinProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the proxy did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
