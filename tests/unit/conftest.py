"""The unit tier stays pure: a test here that starts a process, opens a network socket, asks for a
heavy fixture (an S3 server, a real model, a control plane) or imports torch fails, saying where it
belongs (tests/component). Cheap by construction, the tier runs in parallel (``make check``)."""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.roots import Root

# Airflow's croniter asks platform.architecture() on import, which runs `file -b`: imported here,
# before the guard below, or a test that imports Airflow first (run alone, say) fails for it.
with contextlib.suppress(ImportError):  # no Airflow in this environment
    import croniter  # noqa: F401

HERE = Path(__file__).parent
# Fixtures that start a server or a process, or build a model: tests/component's.
HEAVY_FIXTURES = frozenset(
    {"s3_server", "tiny_model", "tiny_classifier", "smollm2", "kube", "kube_api", "kube_plane", "vllm_worker"}
)
MOVE = "a unit test may not {what}: move it to tests/component (docs/testing.md)"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    offenders = [
        f"{item.nodeid}: {', '.join(sorted(heavy))}"
        for item in items
        if HERE in item.path.parents
        and (heavy := HEAVY_FIXTURES.intersection(getattr(item, "fixturenames", ())))
    ]
    if offenders:
        raise pytest.UsageError(MOVE.format(what="use these fixtures") + "\n" + "\n".join(offenders))


@pytest.fixture
def root(tmp_path: Path) -> Root:
    """Local disk only: the S3 server's variant of a test runs in tests/component."""
    return Root(str(tmp_path), {}, "local")


def _refuse(what: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(MOVE.format(what=what))

    return refuse


@pytest.fixture(autouse=True)
def _pure(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No process, no network socket (in-process socket pairs, e.g. an event loop's, are fine), no
    torch."""
    torch_before = "torch" in sys.modules
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("start a process"))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", _refuse("start a process"))
    monkeypatch.setattr(os, "fork", _refuse("fork"))
    monkeypatch.setattr(os, "posix_spawn", _refuse("start a process"))
    real_connect, real_bind = socket.socket.connect, socket.socket.bind

    def guarded(real: Any, what: str) -> Any:
        def call(sock: socket.socket, address: Any) -> Any:
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                raise AssertionError(MOVE.format(what=f"{what} a network socket ({address!r})"))
            return real(sock, address)

        return call

    monkeypatch.setattr(socket.socket, "connect", guarded(real_connect, "connect"))
    monkeypatch.setattr(socket.socket, "connect_ex", guarded(socket.socket.connect_ex, "connect"))
    monkeypatch.setattr(socket.socket, "bind", guarded(real_bind, "bind"))
    yield
    if not torch_before and "torch" in sys.modules:
        pytest.fail(MOVE.format(what="import torch (a model run)"))
