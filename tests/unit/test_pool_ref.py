"""``worker_pool`` strings parse once into a PoolRef; connections resolve to the pool their extra names."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.pools import LocalPool, PoolRef, StaticPool, open_backend, require_endpoints


@dataclass
class Conn:
    conn_id: str
    host: str | None = None
    password: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def extra_dejson(self) -> dict[str, Any]:
        return self.extra


def test_references_parse_and_print_back() -> None:
    for text in (
        "local://demo",
        "kubernetes://ns/p",
        "kubernetes://gpu/qwen?kubernetes_conn_id=k8s",
        "gpu_pool",
    ):
        assert str(PoolRef.parse(text)) == text
    ref = PoolRef.parse("kubernetes://gpu-pools/qwen?kubernetes_conn_id=k8s")
    assert (ref.backend, ref.namespace, ref.name, ref.kubernetes_conn_id) == (
        "kubernetes",
        "gpu-pools",
        "qwen",
        "k8s",
    )
    assert PoolRef.parse(" local://x ") == PoolRef("local", "x")
    assert PoolRef.parse("my_conn").needs_connection


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kubernetes://justaname", "NAMESPACE/NAME"),
        ("local://bad name!", "letters, digits"),
        ("http://10.0.0.1:8000", "connection id"),
        ("", "empty"),
    ],
)
def test_bad_references_say_what_to_write(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        PoolRef.parse(text)


def test_connections_resolve_by_their_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHINFER_CACHE", str(tmp_path))
    ref = PoolRef.parse("gpu")
    static = open_backend(ref, Conn("gpu", host="http://127.0.0.1:9, http://127.0.0.2:9 ", password="s3cret"))
    assert isinstance(static, StaticPool)
    assert static.endpoints() == ["http://127.0.0.1:9", "http://127.0.0.2:9"] and static.token() == "s3cret"
    assert static.keep("dag/run") is None and static.release("dag/run") == 2  # not ours to manage
    local = open_backend(ref, Conn("gpu", extra={"backend": "local", "local_pool": "shared"}))
    assert isinstance(local, LocalPool) and str(local) == "local://shared"
    k8s = ref.resolve(Conn("gpu", extra={"backend": "kubernetes", "pool": "qwen", "namespace": "gpu"}))
    assert k8s == PoolRef("kubernetes", "qwen", "gpu")
    with pytest.raises(ConfigError, match=r"extra\.pool"):
        ref.resolve(Conn("gpu", extra={"backend": "kubernetes"}))
    with pytest.raises(ConfigError, match="not local, kubernetes or static"):
        ref.resolve(Conn("gpu", extra={"backend": "ray"}))
    with pytest.raises(ConfigError, match="look it up first"):
        open_backend(ref)
    with pytest.raises(ConfigError, match="at least one worker URL"):
        open_backend(ref, Conn("gpu", host=" , "))


def test_a_kubernetes_conn_id_needs_the_airflow_provider() -> None:
    with pytest.raises(ConfigError, match="cncf"):
        open_backend(PoolRef.parse("kubernetes://ns/p?kubernetes_conn_id=k8s"))


def test_no_live_workers_is_a_clear_error(tmp_path: Path) -> None:
    pool = LocalPool("empty", state_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"never started.*pool setup task"):
        require_endpoints(pool)
