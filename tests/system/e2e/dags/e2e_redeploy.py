"""``e2e_redeploy``: its output_root default is read from a file each time this file is parsed (each
task start), as if the file were redeployed with another default while a run is live
(e2e_common.py)."""

from __future__ import annotations

from pathlib import Path

from e2e_common import COMMON, ROOT, SIMULATED

from airflow_batchinfer.dag_factory import build_batch_inference_dag

REDEPLOYED_ROOT = Path(ROOT) / "redeploy" / "output_root"
build_batch_inference_dag(
    "e2e_redeploy",
    max_rounds=1,
    defaults={
        **SIMULATED,
        "output_root": REDEPLOYED_ROOT.read_text().strip() if REDEPLOYED_ROOT.exists() else f"{ROOT}/runs",
    },
    **COMMON,
)
