"""``chaos_s3``: the run root on the S3 server, reached through the AWS connection ``chaos_s3``
(chaos_common.py)."""

from __future__ import annotations

from datetime import timedelta

from chaos_common import BUCKET, COMMON, SIMULATED

from airflow_batchinfer.dag_factory import build_batch_inference_dag

build_batch_inference_dag(
    "chaos_s3",
    defaults={**SIMULATED, "output_root": f"s3://{BUCKET}/chaos", "worker_pool": "local://chaos-s3"},
    aws_conn_id="chaos_s3",
    default_args={"lost_grace_s": 5.0},
    **{**COMMON, "retries": 3, "retry_delay": timedelta(seconds=8)},
)
