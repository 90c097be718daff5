"""Browser tests: headless Chromium from the system's ``chromium`` package (Debian's), driven by
Playwright, which never downloads a browser of its own here (``PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD``;
the Makefile's ``chromium`` target installs the package when it is missing).

- :func:`chromium_executable` / :func:`missing`: what a test needs, and why it would skip;
- :class:`Shots`: one PNG per step under ``$BATCHINFER_TEST_ARTIFACTS/<test>/`` (default
  ``tests/artifacts/<test>/``), paths printed;
- :func:`sign_in`: the Airflow UI's own login page;
- :class:`EchoServer`: an OpenAI-compatible endpoint on 127.0.0.1 that answers every prompt with
  the prompt itself, so a run's outputs hold whatever its records hold.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.support.openai_stub import reply_json

os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS_ENV = "BATCHINFER_TEST_ARTIFACTS"


def chromium_executable() -> str | None:
    """The system's Chromium (``chromium``, or ``chromium-browser`` on some distributions)."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def missing() -> str | None:
    """Why the browser tests cannot run here, or ``None`` when they can."""
    lacks = []
    if chromium_executable() is None:
        lacks.append("chromium (apt-get install -y chromium; `make chromium` does it)")
    if importlib.util.find_spec("playwright") is None:
        lacks.append("playwright (the dev extra: make venv)")
    return ("the browser tests need " + " and ".join(lacks)) if lacks else None


@contextlib.contextmanager
def chromium(**launch: Any) -> Iterator[Any]:
    """A headless Chromium from the system's package (never a downloaded one)."""
    from playwright.sync_api import sync_playwright

    executable = chromium_executable()
    if executable is None:
        raise RuntimeError(missing() or "no chromium")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True, **launch)
        try:
            yield browser
        finally:
            browser.close()


def artifacts_dir(test_name: str) -> Path:
    """Where a test's screenshots go: ``$BATCHINFER_TEST_ARTIFACTS/<test>/``, else
    ``tests/artifacts/<test>/`` (ignored by git). Emptied first: what is there is this run's."""
    base = Path(os.environ[ARTIFACTS_ENV]) if os.environ.get(ARTIFACTS_ENV) else REPO / "tests" / "artifacts"
    folder = base / re.sub(r"[^A-Za-z0-9_.-]+", "_", test_name)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class Shots:
    """Numbered full-page screenshots of one test's steps; ``paths`` lists them in order."""

    def __init__(self, test_name: str) -> None:
        self.folder = artifacts_dir(test_name)
        self.paths: list[Path] = []

    def take(self, page: Any, step: str, *, full_page: bool = True) -> Path:
        path = self.folder / f"{len(self.paths) + 1:02d}-{re.sub(r'[^A-Za-z0-9_-]+', '-', step)}.png"
        page.screenshot(path=str(path), full_page=full_page)
        self.paths.append(path)
        print(f"screenshot: {path}", flush=True)
        return path

    def take_element(self, locator: Any, step: str) -> Path:
        """A screenshot of one element (an iframe: the page inside it)."""
        path = self.folder / f"{len(self.paths) + 1:02d}-{re.sub(r'[^A-Za-z0-9_-]+', '-', step)}.png"
        locator.screenshot(path=str(path))
        self.paths.append(path)
        print(f"screenshot: {path}", flush=True)
        return path


def sign_in(page: Any, airflow: Any, next_path: str = "/") -> None:
    """Log in to ``airflow`` (a :class:`~airflow_batchinfer.dev.airflow.DevAirflow`: its url,
    username and password) through the UI's login page (SimpleAuthManager: username, password,
    "Sign in") and wait until it has sent the browser on to ``next_path``."""
    page.goto(f"{airflow.url}/auth/login?next={urllib.parse.quote(airflow.url + next_path, safe='')}")
    page.fill("input[name=username]", airflow.username)
    page.fill("input[name=password]", airflow.password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(lambda url: "/auth/" not in url)


class EchoServer:
    """An OpenAI-compatible ``/v1/completions`` and ``/v1/chat/completions`` that answer each request
    with its prompt (a chat request: its last message's content). ``prompts`` lists what came in."""

    def __init__(self) -> None:
        self.prompts: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if self.path.endswith("/chat/completions"):
                    text = str((body.get("messages") or [{}])[-1].get("content", ""))
                    choice: dict[str, Any] = {"message": {"role": "assistant", "content": text}}
                elif self.path.endswith("/completions"):
                    text = str(body.get("prompt", ""))
                    choice = {"text": text}
                else:
                    self.send_error(404)
                    return
                server.prompts.append(text)
                reply_json(self, {
                    "choices": [{**choice, "index": 0, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": len(text) // 4 + 1, "completion_tokens": len(text) // 4 + 1},
                })  # fmt: skip

            def log_message(self, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="echo-openai", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __enter__(self) -> EchoServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
