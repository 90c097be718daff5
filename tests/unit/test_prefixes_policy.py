"""The storage allow-list: local paths are compared after resolving symlinks; remote URIs are compared
the way s3fs uses them (the key literally), so dot segments are refused rather than resolved."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.worker.security import PrefixPolicy

pytestmark = pytest.mark.security


def test_a_symlink_inside_an_allowed_directory_cannot_point_outside(tmp_path: Path) -> None:
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    allowed.mkdir()
    outside.mkdir()
    (allowed / "escape").symlink_to(outside)
    (allowed / "inside").symlink_to(allowed / "sub", target_is_directory=True)
    p = PrefixPolicy([str(allowed)])
    assert p.allows(str(allowed / "run" / "x.jsonl"))
    assert not p.allows(str(allowed / "escape" / "x.jsonl"))
    assert not p.allows(f"file://{allowed}/escape/x.jsonl")
    assert not p.allows(str(allowed / "escape"))
    assert p.allows(str(allowed / "inside" / "x.jsonl"))  # a link that stays inside is fine
    reason = p.why_not(str(allowed / "escape" / "x.jsonl"))
    assert reason is not None and str(outside) in reason


def test_a_symlinked_prefix_allows_where_it_points(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    p = PrefixPolicy([str(tmp_path / "link")])
    assert p.allows(str(real / "x"))
    assert p.allows(str(tmp_path / "link" / "x"))
    assert not p.allows(str(tmp_path / "x"))


def test_a_file_symlink_to_a_secret_is_refused(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    os.symlink(secret, allowed / "input.jsonl")
    assert not PrefixPolicy([str(allowed)]).allows(str(allowed / "input.jsonl"))


@pytest.mark.parametrize(
    "uri",
    [
        "s3://b/other/../runs/x",  # the key is literally other/../runs/x: not under runs/
        "s3://b/runs/../secret",
        "s3://b/runs/./x",
        "s3://b/runs/x/..",
        "s3://b/runs/%2e%2e/secret",
        "s3a://b/runs/../x",
        "gs://b/runs/../x",
    ],
)
def test_dot_segments_in_remote_uris_are_refused_not_resolved(uri: str) -> None:
    p = PrefixPolicy(["s3://b/runs", "gs://b/runs"])
    assert not p.allows(uri)
    reason = p.why_not(uri)
    assert reason is not None and "segment" in reason


def test_s3a_is_s3_and_schemes_are_case_insensitive() -> None:
    p = PrefixPolicy(["s3://b/runs/"])
    assert p.allows("s3a://b/runs/x")
    assert p.allows("S3://b/runs/x")
    assert PrefixPolicy(["s3a://b/runs"]).allows("s3://b/runs/x")
    assert not p.allows("gs://b/runs/x")


def test_prefix_boundaries_are_segments() -> None:
    p = PrefixPolicy(["s3://b/runs"])
    assert p.allows("s3://b/runs")
    assert p.allows("s3://b/runs/")
    assert p.allows("s3://b/runs/x/y.jsonl.zst")
    assert not p.allows("s3://b/runs2/x")
    assert not p.allows("s3://b/run")
    assert not p.allows("s3://b2/runs/x")
    assert not p.allows("s3://b//runs/x")  # the key /runs/x is another key
    assert p.why_not("s3://b/runs2/x") == "s3://b/runs2/x is outside this worker's allowed prefixes"
    assert p.why_not("s3://b/runs/x") is None


def test_bucket_wide_prefix(tmp_path: Path) -> None:
    p = PrefixPolicy(["s3://b", "s3://c/"])
    assert p.allows("s3://b/anything/at/all")
    assert p.allows("s3://c/x")
    assert not p.allows("s3://bb/x")


def test_fsspec_chaining_is_refused(tmp_path: Path) -> None:
    p = PrefixPolicy([str(tmp_path), "s3://b/runs"])
    for uri in (f"{tmp_path}/x::s3://other/y", "simplecache::s3://b/runs/x", "zip://a::s3://b/runs/x.zip"):
        assert not p.allows(uri), uri
        assert "::" in (p.why_not(uri) or "")


def test_local_traversal_still_refused(tmp_path: Path) -> None:
    p = PrefixPolicy([str(tmp_path / "runs")])
    assert not p.allows(f"{tmp_path}/runs/../secret")
    assert not p.allows(f"{tmp_path}/runs-other/x")
    assert p.allows(f"{tmp_path}/runs/a/../b")  # resolves inside: that is the file opened


def test_none_allows_all_and_empty_is_an_error() -> None:
    assert PrefixPolicy(None).allows("s3://b/../x")
    assert PrefixPolicy(None).why_not("s3://b/../x") is None
    with pytest.raises(ConfigError, match="allow-prefix"):
        PrefixPolicy([])


def test_a_prefix_with_dot_segments_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="segment"):
        PrefixPolicy(["s3://b/runs/../x"])
