"""Provider metadata for Airflow's providers manager (entry point ``apache_airflow_provider``).

Kept free of imports so the providers manager can read it cheaply.
"""

from __future__ import annotations

from typing import Any


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
            {
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
                "conn-fields": {
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
                },
            }
        ],
        "hooks": [
            {"integration-name": "Batch Inference", "python-modules": ["airflow_batchinfer.hooks.pool"]}
        ],
        "triggers": [
            {
                "integration-name": "Batch Inference",
                "python-modules": [
                    "airflow_batchinfer.triggers.worker_job",
                    "airflow_batchinfer.triggers.pool_ready",
                ],
            }
        ],
        "operators": [
            {
                "integration-name": "Batch Inference",
                "python-modules": [
                    "airflow_batchinfer.operators.shard",
                    "airflow_batchinfer.operators.shard_jobs",
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
