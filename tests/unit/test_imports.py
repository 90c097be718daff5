"""The worker side must import without Airflow or heavy optional packages."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("airflow", "vllm", "torch", "transformers", "boto3", "botocore", "s3fs", "kubernetes")


def test_worker_side_imports_nothing_heavy() -> None:
    code = (
        "import sys, airflow_batchinfer.storage, airflow_batchinfer.batching, airflow_batchinfer.cli\n"
        "import airflow_batchinfer.engines, airflow_batchinfer.judges, airflow_batchinfer.worker.server\n"
        "import airflow_batchinfer.rpc.pool, airflow_batchinfer.pools, airflow_batchinfer.pipeline\n"
        "from airflow_batchinfer.engines import create_engine; create_engine('simulated')\n"
        f"heavy = [m for m in sys.modules if m.split('.')[0] in {HEAVY!r}]\n"
        "print(','.join(sorted(heavy)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_get_provider_info_imports_only_the_standard_library() -> None:
    code = (
        "import sys; before = set(sys.modules)\n"
        "from airflow_batchinfer.get_provider_info import get_provider_info; get_provider_info()\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(sorted(new - set(sys.stdlib_module_names) - {'airflow_batchinfer'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
