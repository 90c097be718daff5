"""``chaos_gate``: a review gate before every round after the first that gives the run's lease back
(``gate_idle`` release) 2 s after it opens, on a pool whose workers exit 1 s after their last use
(chaos_common.py): while the gate waits, the pool is at zero."""

from __future__ import annotations

from chaos_common import COMMON, SIMULATED

from airflow_batchinfer.dag_factory import build_batch_inference_dag

build_batch_inference_dag(
    "chaos_gate",
    defaults={
        **SIMULATED,
        "review": "every_round",
        "worker_pool": "local://chaos-gate",
        "idle_ttl_s": 1,
        "gate_idle": "release",
        "gate_keep_warm_s": 2,
    },
    default_args={"lost_grace_s": 5.0},
    **COMMON,
)
