"""AWS connection → S3 storage options, checked against the real S3 server (wrong secrets refused)."""

from __future__ import annotations

import json
import sys

import pytest

from airflow_batchinfer.storage import JsonlFile
from tests.support.seaweedfs import S3Server

pytest.importorskip("airflow", reason="needs the airflow extra")
pytestmark = [pytest.mark.airflow, pytest.mark.s3]

from airflow_batchinfer.hooks.aws import storage_options_from_aws_conn  # noqa: E402


def define_conn(monkeypatch: pytest.MonkeyPatch, conn_id: str, server: S3Server, secret: str) -> None:
    conn = {
        "conn_type": "aws",
        "login": server.key,
        "password": secret,
        "extra": {"endpoint_url": server.endpoint_url, "region_name": "us-east-1"},
    }
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))


def test_no_connection_means_environment() -> None:
    assert storage_options_from_aws_conn(None) == {}


@pytest.mark.parametrize("amazon_provider", [True, False], ids=["amazon-hook", "plain-connection"])
def test_connection_credentials_reach_s3_and_wrong_secret_is_refused(
    monkeypatch: pytest.MonkeyPatch, s3_server: S3Server, amazon_provider: bool
) -> None:
    if not amazon_provider:  # the same connection read without the Amazon provider installed
        monkeypatch.setitem(sys.modules, "airflow.providers.amazon.aws.hooks.base_aws", None)
    define_conn(monkeypatch, "batch_s3", s3_server, s3_server.secret)
    define_conn(monkeypatch, "batch_s3_bad", s3_server, "wrong-secret")
    good = storage_options_from_aws_conn("batch_s3")
    assert good["endpoint_url"] == s3_server.endpoint_url
    assert good["client_kwargs"] == {"region_name": "us-east-1"}
    uri = f"s3://{s3_server.bucket}/hooks-{amazon_provider}/data.jsonl"
    f = JsonlFile(uri, storage_options={**good, "skip_instance_cache": True})
    with f.writer_sync() as w:
        w.write({"id": 1})
    assert list(f.iter_records()) == [{"id": 1}]

    bad = storage_options_from_aws_conn("batch_s3_bad")
    with pytest.raises(PermissionError):
        list(JsonlFile(uri, storage_options={**bad, "skip_instance_cache": True}).iter_records())
