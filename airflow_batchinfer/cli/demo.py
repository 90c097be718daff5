"""``batchinfer demo``: the pipeline end to end with a real small model."""

from __future__ import annotations

import argparse
from typing import Any


def add_commands(sub: Any) -> None:
    """``demo``."""
    p = sub.add_parser("demo", help="run the pipeline end to end with a real small model (SmolLM2)")
    p.add_argument(
        "--workdir",
        default=None,
        help="where the dataset and run go (default ~/.cache/airflow-batchinfer/demo)",
    )
    p.add_argument("--records", type=int, default=40)
    p.add_argument(
        "--review",
        choices=["auto", "ui"],
        default="auto",
        help="auto: the demo answers each review gate after 10 s; ui: it prints the run's review desk and "
        "Required Actions page and waits for you to answer there",
    )
    p.add_argument("--no-airflow", action="store_true", help="run the rounds without Airflow")
    p.add_argument("--max-rounds", type=int, default=3, help="with --no-airflow")
    p.add_argument("--data-only", action="store_true", help="only write the dataset the example DAGs read")
    p.add_argument(
        "--keep",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="keep Airflow up at the end until Enter (default: when run in a terminal)",
    )
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> None:
    from pathlib import Path

    from airflow_batchinfer.demo import make_dataset, run_airflow_demo, run_demo
    from airflow_batchinfer.engines.models import default_cache_dir

    workdir = (Path(args.workdir) if args.workdir else default_cache_dir() / "demo").resolve()
    if args.data_only:
        make_dataset(workdir / "arithmetic.jsonl", args.records)
        print(workdir / "arithmetic.jsonl")
        return
    if args.no_airflow:
        summary = run_demo(workdir, n=args.records, max_rounds=args.max_rounds)
    else:
        summary = run_airflow_demo(workdir, n=args.records, review=args.review, keep=args.keep)
    if not summary["invariant"]["ok"]:
        raise SystemExit("demo: the id invariant failed; see the report")
