"""``batchinfer worker serve``: the warm worker process. Its start imports what a worker uses alone
(tests/unit/test_cli_worker.py)."""

from __future__ import annotations

import argparse
from typing import Any


def add_commands(sub: Any) -> None:
    """``batchinfer worker serve``, with the flags of :mod:`airflow_batchinfer.worker.settings`."""
    from airflow_batchinfer.worker.settings import add_worker_arguments

    worker = sub.add_parser("worker", help="the warm worker process").add_subparsers(
        dest="worker_command", required=True
    )
    p = worker.add_parser("serve", help="serve shard jobs over HTTP (model loaded once)")
    add_worker_arguments(p)  # each flag also reads BATCHINFER_WORKER_<FLAG> (containers)
    p.set_defaults(func=_cmd_worker_serve)


def _cmd_worker_serve(args: argparse.Namespace) -> None:
    from airflow_batchinfer.worker.config import WorkerConfig
    from airflow_batchinfer.worker.server import serve
    from airflow_batchinfer.worker.settings import settings_from_args

    config = WorkerConfig.from_settings(settings_from_args(args))
    if config.allowed_prefixes == []:
        from airflow_batchinfer.worker.security import PrefixPolicy

        PrefixPolicy([])  # raises the explanatory error
    serve(config)
