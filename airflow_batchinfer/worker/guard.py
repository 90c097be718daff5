"""The worker's front door: a pure ASGI middleware that runs before FastAPI reads a request.

For every path but the probes (``/v1/health``, ``/v1/ready``) it

1. checks the bearer token from the headers first: a missing or wrong one is a 401 and the body is
   never read (an unauthenticated client cannot make the worker allocate);
2. bounds the body: a ``Content-Length`` over ``max_body_bytes`` is a 413 at once; a chunked body is
   counted as it streams in and is a 413 as soon as it passes the limit. A body within the limit is
   handed to the app as one message (at most ``max_body_bytes`` per request in memory).

Errors have the API's shape, ``{"error": CODE, "detail": TEXT}``, and close the connection (the
client may still be sending a body nobody will read).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from airflow_batchinfer.worker.security import token_ok

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = frozenset({"/v1/health", "/v1/ready"})


class RequestGuard:
    """Token first, then a bounded body (see the module docstring).

    :param token: the bearer token callers must send; ``None`` checks none (``--insecure-no-auth``).
    :param max_body_bytes: the largest request body read; larger is a 413.
    """

    def __init__(self, app: ASGIApp, *, token: str | None, max_body_bytes: int) -> None:
        self.app = app
        self.token = token
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        if self.token is not None:
            auth = headers.get(b"authorization")
            if not token_ok(auth.decode("latin-1") if auth is not None else None, self.token):
                await _error(
                    send,
                    401,
                    "unauthorized",
                    "missing or wrong bearer token",
                    [(b"www-authenticate", b"Bearer")],
                )
                return
        too_large = f"the request body is over {self.max_body_bytes} bytes (the worker's --max-body-bytes)"
        length = headers.get(b"content-length")
        if length is not None:
            if not length.isdigit():
                await _error(send, 400, "bad_request", "invalid Content-Length")
                return
            if int(length) > self.max_body_bytes:
                await _error(send, 413, "payload_too_large", too_large)
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_body_bytes:
                await _error(send, 413, "payload_too_large", too_large)
                return
            if body:
                chunks.append(body)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # after the body: http.disconnect, when it comes

        await self.app(scope, replay, send)


async def _error(
    send: Send, status: int, error: str, detail: str, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = json.dumps({"error": error, "detail": detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
