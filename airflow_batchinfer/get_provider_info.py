"""Provider metadata for Airflow's providers manager (entry point ``apache_airflow_provider``).

Kept free of heavy imports so the providers manager can read it cheaply: the limits' descriptions
(``airflow_batchinfer.spec.limit_settings``, which imports nothing but the exception tree) and the
one-host option (``airflow_batchinfer.pools.one_host``, standard library only) give the config
section and the connection's limit fields.
"""

from __future__ import annotations

from typing import Any

from airflow_batchinfer.pools.one_host import ONE_HOST_OPTION
from airflow_batchinfer.review.bounds import DESK_SETTINGS
from airflow_batchinfer.spec.limit_settings import CONFIG_SECTION, POOL_NETWORK_SETTINGS, SETTINGS

_EXAMPLES = {
    "prefixes": "s3://datasets/llm/,s3://runs/batchinfer/",
    "names": "name-a,name-b",
    "count": "8",
    "quantity": "64Gi",
}
_LISTS = ("prefixes", "names")  # written comma-separated; a count or a quantity is one value


def _config() -> dict[str, Any]:
    """``[batchinfer]``: the deployment's limits on trigger params (docs: Security model)."""
    options = {
        s.name: {
            "description": s.help.replace("`", "") + (". Comma-separated." if s.type in _LISTS else "."),
            "version_added": "0.1.0",
            "type": "integer" if s.type == "count" else "string",
            "example": _EXAMPLES[s.type],
            "default": None,
        }
        for s in SETTINGS
    }
    options[ONE_HOST_OPTION] = {
        "description": "Every Airflow component that runs tasks or triggers is on one host, whatever "
        "[core] executor says, so local:// pools may be used (docs: Deployment).",
        "version_added": "0.1.0",
        "type": "boolean",
        "example": "True",
        "default": "False",
    }
    for n in POOL_NETWORK_SETTINGS:  # a Kubernetes pool's NetworkPolicy, where its connection is silent
        options[n.name] = {
            "description": n.help.replace("`", "") + ". A pool connection's extra of the same name wins.",
            "version_added": "0.1.0",
            "type": "string",
            "example": n.example,
            "default": None,
        }
    for d in DESK_SETTINGS:  # the review desk's caps, read by the api-server
        options[d.name] = {
            "description": d.help.replace("`", "") + f". Bytes, at least {d.minimum}.",
            "version_added": "0.1.0",
            "type": "integer",
            "example": str(d.default),
            "default": str(d.default),
        }
    return {
        CONFIG_SECTION: {
            "description": "What people who trigger a batch inference DAG may choose, for every DAG of "
            "this deployment (a DAG's defaults and limits, and a pool connection's extra, widen it), "
            "where this deployment's components run, and how much the review desk returns at once.",
            "options": options,
        }
    }


def _limit_fields() -> dict[str, Any]:
    """The same limits on a ``batchinfer_pool`` connection: they apply to runs on that pool."""
    return {
        s.name: {
            "label": s.name.replace("_", " ").capitalize(),
            "description": s.help.replace("`", "") + (" (comma-separated)" if s.type in _LISTS else ""),
            "schema": {"type": ["integer", "null"]} if s.type == "count" else {"type": ["string", "null"]},
        }
        for s in SETTINGS
    }


def _network_fields() -> dict[str, Any]:
    """Who may call the kubernetes backend's workers (over the ``[batchinfer]`` keys of that name)."""
    return {
        n.name: {
            "label": n.name.replace("_", " ").capitalize().replace("Rpc", "RPC"),
            "description": f"for the kubernetes backend: {n.help.replace('`', '')} (over [{CONFIG_SECTION}] "
            f"{n.name})",
            "schema": {"type": ["string", "null"]},
        }
        for n in POOL_NETWORK_SETTINGS
    }


def _connection_type() -> dict[str, Any]:
    """The ``batchinfer_pool`` connection type: its form's fields, labels and placeholders."""
    return {
        "hook-class-name": "airflow_batchinfer.hooks.pool.BatchInferPoolHook",
        "hook-name": "Batch Inference worker pool",
        "connection-type": "batchinfer_pool",
        "ui-field-behaviour": {
            "hidden-fields": ["schema", "port", "login"],
            "relabeling": {"host": "Worker URLs", "password": "RPC token"},
            "placeholders": {
                "host": "http://10.0.0.5:8000,http://10.0.0.6:8000 (static backend)",
                "password": "the token the workers accept (--token-file)",
            },
        },
        "conn-fields": {**_backend_fields(), **_network_fields(), **_limit_fields()},
    }


def _backend_fields() -> dict[str, Any]:
    """The connection's backend and where its workers are (a local pool's name, a Kubernetes one's)."""
    return {
        "backend": {
            "label": "Backend",
            "description": "static: the URLs above; local: worker processes on the Airflow "
            "host; kubernetes: a worker Deployment leased and scaled through the API",
            "schema": {
                "type": "string",
                "enum": ["static", "local", "kubernetes"],
                "default": "static",
            },
        },
        "local_pool": {
            "label": "Local pool name",
            "description": "for the local backend: the pool `batchinfer pool up --name` started",
            "schema": {"type": ["string", "null"]},
        },
        "namespace": {
            "label": "Kubernetes namespace",
            "description": "for the kubernetes backend (bind the Role in k8s/base/rbac.yaml)",
            "schema": {"type": ["string", "null"]},
        },
        "pool": {
            "label": "Kubernetes pool name",
            "description": "for the kubernetes backend: the worker Deployment's name",
            "schema": {"type": ["string", "null"]},
        },
        "kubernetes_conn_id": {
            "label": "Kubernetes connection",
            "description": "a cncf.kubernetes connection; empty: in-cluster or $KUBECONFIG",
            "schema": {"type": ["string", "null"]},
        },
    }


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-batchinfer",
        "name": "Batch Inference",
        "description": (
            "LLM batch inference at 100M-sample scale: sharded JSONL datasets in object storage, warm "
            "GPU worker pools, judging and retry rounds with human review."
        ),
        "versions": ["0.1.0"],
        "connection-types": [
            _connection_type(),
        ],
        "config": _config(),
        "hooks": [
            {"integration-name": "Batch Inference", "python-modules": ["airflow_batchinfer.hooks.pool"]}
        ],
        "triggers": [
            {
                "integration-name": "Batch Inference",
                "python-modules": [
                    "airflow_batchinfer.triggers.lane",
                    "airflow_batchinfer.triggers.pool_ready",
                ],
            }
        ],
        "operators": [
            {
                "integration-name": "Batch Inference",
                "python-modules": [
                    "airflow_batchinfer.operators.pin",
                    "airflow_batchinfer.operators.shard",
                    "airflow_batchinfer.operators.lanes",
                    "airflow_batchinfer.operators.rounds",
                    "airflow_batchinfer.operators.pool",
                    "airflow_batchinfer.operators.report",
                ],
            }
        ],
        "integrations": [
            {
                "integration-name": "Batch Inference",
                "tags": ["software"],
            }
        ],
    }
