"""S3 credentials on the Airflow side: fsspec ``storage_options`` from an Airflow AWS connection.

With the Amazon provider installed, its ``AwsBaseHook`` resolves the connection (role assumption,
profiles, per-service endpoint URLs included). Without it, the connection's login, password and
``endpoint_url`` / ``region_name`` extras are used directly.
"""

from __future__ import annotations

from typing import Any


def storage_options_from_aws_conn(aws_conn_id: str | None) -> dict[str, Any]:
    """Options for ``s3://`` storage from ``aws_conn_id``; ``{}`` (the environment) when ``None``."""
    if not aws_conn_id:
        return {}
    try:
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
    except ImportError:
        return _from_plain_connection(aws_conn_id)
    hook = AwsBaseHook(aws_conn_id=aws_conn_id, client_type="s3")
    creds = hook.get_credentials()
    options: dict[str, Any] = {"key": creds.access_key, "secret": creds.secret_key}
    if creds.token:
        options["token"] = creds.token
    endpoint = hook.conn_config.get_service_endpoint_url("s3")
    if endpoint:
        options["endpoint_url"] = endpoint
    if hook.region_name:
        options["client_kwargs"] = {"region_name": hook.region_name}
    return options


def _from_plain_connection(aws_conn_id: str) -> dict[str, Any]:
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(aws_conn_id)
    extra = conn.extra_dejson
    options: dict[str, Any] = {}
    if conn.login:
        options["key"] = conn.login
    if conn.password:
        options["secret"] = conn.password
    if extra.get("aws_session_token"):
        options["token"] = extra["aws_session_token"]
    if extra.get("endpoint_url"):
        options["endpoint_url"] = extra["endpoint_url"]
    if extra.get("region_name"):
        options["client_kwargs"] = {"region_name": extra["region_name"]}
    return options
