"""The test harness's Kubernetes control plane picks its ports where nothing else takes them, and
tries again when a component's port was taken anyway (an etcd that failed to bind failed a CI run)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from airflow_batchinfer.dev import kube_plane as kube


def test_ports_are_free_consecutive_and_below_the_ephemeral_range(monkeypatch: pytest.MonkeyPatch) -> None:
    real = kube.random.randint
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        draws = iter([taken - 1, taken - 2])  # both blocks of 4 hold the listening port: drawn again
        monkeypatch.setattr(kube.random, "randint", lambda a, b: next(draws, None) or real(a, b))
        first = kube._free_ports()
        assert taken not in range(first, first + 4) and first not in (taken - 1, taken - 2)
        assert kube.PORT_RANGE[0] <= first <= kube.PORT_RANGE[1]
    assert kube.PORT_RANGE[1] + 3 < 32_768  # the kernel's ephemeral ports start at 32768 by default


def test_a_taken_port_is_told_from_the_logs(tmp_path: Path) -> None:
    (tmp_path / "apiserver.log").write_text("Error: context deadline exceeded\n")
    assert not kube._port_taken(tmp_path)
    (tmp_path / "etcd.log").write_text("etcdmain: listen tcp 127.0.0.1:35666: bind: address already in use\n")
    assert kube._port_taken(tmp_path)
