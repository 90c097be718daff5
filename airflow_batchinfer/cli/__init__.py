"""``batchinfer``: the command line. Thin wiring only; the logic lives in the library modules. A
module per command group (:mod:`.shard`: ``shard`` and ``recompact``; :mod:`.worker`; :mod:`.pool`;
:mod:`.run`; :mod:`.demo`; :mod:`.plan`), each adding its parsers; what a command runs is imported
when it runs, so a worker's start (``worker serve``) imports none of the others'."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence

from airflow_batchinfer import __version__
from airflow_batchinfer.exceptions import BatchInferError

COMMAND_GROUPS = ("shard", "worker", "pool", "run", "demo", "plan")  # in the help's order


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``batchinfer`` parser; with ``command="worker"``, that command's alone: a worker's start
    (``worker serve``) then imports none of the run's settings, the pools or the Kubernetes commands."""
    parser = argparse.ArgumentParser(prog="batchinfer", description="LLM batch inference at scale.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    # shard adds shard and recompact; each group's module is imported only when its parsers are built
    for group in ("worker",) if command == "worker" else COMMAND_GROUPS:
        importlib.import_module(f"{__name__}.{group}").add_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Every worker starts with `worker serve`: its parser alone, without the imports of the others'.
    args = build_parser("worker" if argv[:1] == ["worker"] else None).parse_args(argv)
    try:
        summary = args.func(args)
    except (BatchInferError, FileNotFoundError, ValueError) as exc:
        print(f"batchinfer {args.command}: error: {exc}", file=sys.stderr)
        return 1
    if summary is not None:
        print(json.dumps(summary, indent=2))
    return 0
