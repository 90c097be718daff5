"""``batchinfer worker serve`` parses with the worker's flags alone: the same arguments as the full
parser, without importing what only the other commands use (every local worker starts this way)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from airflow_batchinfer.cli import build_parser

BIN = str(Path(sys.executable).parent / "batchinfer")
ARGV = ["worker", "serve", "--engine", "simulated", "--concurrency", "3", "--allow-prefix", "/data",
        "--allow-prefix", "s3://b/p", "--engine-arg", "latency_base_s=0.5", "--idle-ttl", "60"]  # fmt: skip
# Modules of the other commands (the run's settings, the pools, sizing) and httpx (with its CLI's
# rich), which a simulated worker never uses: the worker's start no longer pays for them.
NOT_AT_START = ("airflow_batchinfer.pools", "airflow_batchinfer.spec", "airflow_batchinfer.run.sizing",
                "airflow_batchinfer.run.sizing_plan", "airflow_batchinfer.run.lane_schedule",
                "airflow_batchinfer.rpc.client", "httpx", "rich")  # fmt: skip
HEAVY = ("airflow", "vllm", "torch", "transformers", "boto3", "botocore", "s3fs", "kubernetes")


def test_the_worker_parser_reads_worker_serve_as_the_full_parser_does() -> None:
    full = vars(build_parser().parse_args(ARGV))
    alone = vars(build_parser("worker").parse_args(ARGV))
    assert alone == full
    assert alone["engine_options"] == ["latency_base_s=0.5"] and alone["allowed_prefixes"] == [
        "/data",
        "s3://b/p",
    ]


def test_a_worker_start_imports_only_what_a_worker_uses(tmp_path: Path) -> None:
    """Through ``main`` as the ``batchinfer`` script runs it, up to the server (``serve`` replaced:
    it would serve forever), config validation included."""
    code = (
        "import sys\n"
        "import airflow_batchinfer.worker.server as server\n"
        "server.serve = lambda config: config.validate()\n"
        "from airflow_batchinfer.cli import main\n"
        f"assert main({[*ARGV, '--insecure-no-auth']!r}) == 0\n"
        f"names = {NOT_AT_START + HEAVY!r}\n"
        "found = [m for m in sys.modules if any(m == n or m.startswith(n + '.') for n in names)]\n"
        "print(','.join(sorted(found)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == ""


def test_help_still_lists_every_command_and_worker_serve_its_flags() -> None:
    top = subprocess.run([BIN, "--help"], capture_output=True, text=True, timeout=120)
    assert all(c in top.stdout for c in ("shard", "recompact", "worker", "pool", "run", "demo", "plan"))
    serve = subprocess.run([BIN, "worker", "serve", "--help"], capture_output=True, text=True, timeout=120)
    assert serve.returncode == 0 and "--allow-prefix" in serve.stdout and "--announce-file" in serve.stdout
    assert subprocess.run([BIN, "worker"], capture_output=True, text=True, timeout=120).returncode == 2
