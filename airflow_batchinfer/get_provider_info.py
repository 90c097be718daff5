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
    }
