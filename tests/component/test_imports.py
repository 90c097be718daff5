"""The worker side must import without Airflow or heavy optional packages."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("airflow", "vllm", "torch", "transformers", "boto3", "botocore", "s3fs", "kubernetes")
# What the run's documents (which the worker imports) must not load of the package.
ORCHESTRATION = ("spec", "pools", "operators", "review", "run.gate")


def test_worker_side_imports_nothing_heavy() -> None:
    code = (
        "import sys, airflow_batchinfer.storage, airflow_batchinfer.batching, airflow_batchinfer.cli\n"
        "import airflow_batchinfer.engines, airflow_batchinfer.judges, airflow_batchinfer.worker.server\n"
        "import airflow_batchinfer.rpc.pool, airflow_batchinfer.pools, airflow_batchinfer.run.pipeline\n"
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


def test_the_run_documents_import_nothing_of_the_orchestration() -> None:
    """The worker imports the run's documents for its manifests: they load none of the orchestration's
    settings, limits, pools, operators, review desk or gates."""
    code = (
        "import sys, airflow_batchinfer.state.docs\n"
        f"parts = {ORCHESTRATION!r}\n"
        "names = [f'airflow_batchinfer.{p}' for p in parts]\n"
        "found = [m for m in sys.modules if any(m == n or m.startswith(n + '.') for n in names)]\n"
        "print(','.join(sorted(found)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
