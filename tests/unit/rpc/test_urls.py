"""Worker URLs from pod IPs and bind addresses: IPv6 addresses in brackets (IPv6-only and dual-stack
clusters give pods IPv6 addresses), everything else as it is."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from airflow_batchinfer.rpc.urls import http_url


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("10.0.3.7", "http://10.0.3.7:8000"),
        ("127.0.0.1", "http://127.0.0.1:8000"),
        ("worker-0.batchinfer.llm.svc", "http://worker-0.batchinfer.llm.svc:8000"),
        ("fd00::1", "http://[fd00::1]:8000"),
        ("2001:db8:0:1:2:3:4:5", "http://[2001:db8:0:1:2:3:4:5]:8000"),
        ("::1", "http://[::1]:8000"),
        ("[fd00::1]", "http://[fd00::1]:8000"),  # already bracketed: kept as it is
        (" fd00::1 ", "http://[fd00::1]:8000"),
    ],
)
def test_http_url_brackets_ipv6_only(host: str, url: str) -> None:
    assert http_url(host, 8000) == url
    parsed = httpx.URL(url)  # what the RPC client parses: the same host and port back
    assert parsed.port == 8000 and parsed.host == host.strip().strip("[]")


def _pod(name: str, ip: str | None, ready: bool = True) -> Any:
    return SimpleNamespace(
        metadata=SimpleNamespace(name=name, deletion_timestamp=None),
        spec=SimpleNamespace(node_name="n1"),
        status=SimpleNamespace(
            pod_ip=ip, phase="Running",
            conditions=[SimpleNamespace(type="Ready", status="True" if ready else "False")],
        ),
    )  # fmt: skip


def test_kubernetes_pool_endpoints_of_ipv6_pods_are_bracketed(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("kubernetes", reason="needs the kubernetes extra")
    from kubernetes import client

    from airflow_batchinfer.pools.kubernetes.manager import KubernetesPool

    pool = KubernetesPool(client.ApiClient(), "pool", "llm")
    pods = [_pod("a", "fd00:10:244::5"), _pod("b", "10.244.0.5"), _pod("c", "fd00::9", ready=False)]
    monkeypatch.setattr(pool, "_pods", lambda dep=None: (pods, 8000))
    assert pool.endpoints() == ["http://10.244.0.5:8000", "http://[fd00:10:244::5]:8000"]
