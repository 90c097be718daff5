"""The unit tier's guard (tests/unit/conftest.py) refuses what belongs in tests/component."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest


def test_a_process_is_refused() -> None:
    with pytest.raises(AssertionError, match="may not start a process: move it to tests/component"):
        subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_a_network_socket_is_refused_and_a_socket_pair_is_not() -> None:
    with socket.socket() as s, pytest.raises(AssertionError, match="may not bind a network socket"):
        s.bind(("127.0.0.1", 0))
    a, b = socket.socketpair()  # what an event loop opens for itself
    a.close()
    b.close()


def test_the_root_fixture_is_local_disk_only(root: object) -> None:
    assert getattr(root, "backend", None) == "local"
