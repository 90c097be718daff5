"""A small OpenAI-compatible server on 127.0.0.1 for the openai engine's tests: it answers every
``POST /v1/chat/completions`` with the next of the canned bodies it was given (the last one again
once they run out) and keeps each request's body, so a test reads what the engine sent."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def reply_json(handler: BaseHTTPRequestHandler, value: Any) -> None:
    """Answer ``handler``'s request with ``value`` as a JSON body (200): what a fake OpenAI server
    replies (this one's, tests/support/browser.py's echo server)."""
    data = json.dumps(value).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class OpenAIStub:
    def __init__(self, answers: list[dict[str, Any]]) -> None:
        self.answers = list(answers)
        self.bodies: list[dict[str, Any]] = []
        self.base_url = ""

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        self.bodies.append(body)
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


@contextmanager
def openai_stub(answers: list[dict[str, Any]]) -> Iterator[OpenAIStub]:
    """A running :class:`OpenAIStub` (``base_url``: its ``/v1``), stopped on exit."""
    stub = OpenAIStub(answers)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            reply_json(self, stub.answer(json.loads(self.rfile.read(int(self.headers["Content-Length"])))))

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    stub.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield stub
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
