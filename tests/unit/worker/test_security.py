from __future__ import annotations

import pytest

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.worker.security import PrefixPolicy, is_loopback, token_ok


def test_prefix_policy_resolves_traversal_and_protocols(tmp_path: object) -> None:
    p = PrefixPolicy([f"{tmp_path}/runs", "s3://bucket/batch/"])
    assert p.allows(f"{tmp_path}/runs/a/b.jsonl")
    assert p.allows(f"file://{tmp_path}/runs/x")
    assert not p.allows(f"{tmp_path}/runs/../secrets.txt")
    assert not p.allows(f"{tmp_path}/runs-other/x")  # a prefix of the name is not a parent directory
    assert p.allows("s3://bucket/batch/run/input/part-00000.jsonl.zst")
    assert not p.allows("s3://bucket/batch/../other/x")
    assert not p.allows("s3://bucket/batchy/x")
    assert not p.allows("gs://bucket/batch/x")


def test_empty_prefix_list_is_an_error_and_none_allows_all() -> None:
    with pytest.raises(ConfigError, match="allow-prefix"):
        PrefixPolicy([])
    assert PrefixPolicy(None).allows("s3://anything/at/all")


def test_token_check() -> None:
    assert token_ok("Bearer s3cret", "s3cret")
    assert not token_ok("Bearer wrong", "s3cret")
    assert not token_ok("s3cret", "s3cret")
    assert not token_ok(None, "s3cret")


@pytest.mark.parametrize(
    ("host", "ok"),
    [
        ("127.0.0.1", True),
        ("127.8.9.1", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("10.0.0.1", False),
        ("worker.local", False),
    ],
)
def test_loopback(host: str, ok: bool) -> None:
    assert is_loopback(host) is ok
