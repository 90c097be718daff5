"""``batchinfer plan``: sizing a run before spending (:mod:`~airflow_batchinfer.run.sizing`)."""

from __future__ import annotations

import argparse
from typing import Any

from airflow_batchinfer.exceptions import ConfigError


def add_commands(sub: Any) -> None:
    """``plan``."""
    p = sub.add_parser("plan", help="size a run before spending: shards, lanes, wall, tail, GPU-hours, pool")
    _plan_args(p)
    p.set_defaults(func=_cmd_plan)


def _plan_args(p: argparse.ArgumentParser) -> None:
    """``plan``'s flags, in ``--help``'s order: the workload and pool, the shards and lanes, the
    retries, the output."""
    _workload_args(p)
    _shard_args(p)
    _retry_args(p)
    _gate_args(p)
    p.add_argument("--airflow-pool", default="batchinfer", help="Airflow pool name for the printed command")
    p.add_argument("--json", action="store_true", help="print the plan as JSON instead of a table")


def _workload_args(p: argparse.ArgumentParser) -> None:
    """The records, the GPUs and what a record costs on one."""
    from airflow_batchinfer.run.sizing import DEFAULT_TOKENS_PER_RECORD
    from airflow_batchinfer.spec.settings import setting

    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--records", type=int, help="records in the dataset")
    what.add_argument(
        "--input",
        metavar="URI",
        help="size the dataset from the input itself (a file, a directory or a glob of parts, as the "
        "run setting input takes: listed once, records estimated from one sample)",
    )
    p.add_argument(
        "--arms",
        type=int,
        default=1,
        help="rows each record runs as (fan_out: the adapters, plus the base model with adapters_and_base); "
        "the plan sizes records × arms rows (default 1)",
    )
    p.add_argument("--gpus", type=int, required=True, help="workers, one GPU each (the pool's replicas)")
    p.add_argument(
        "--tokens-per-s",
        type=float,
        required=True,
        help="tokens a second one GPU turns out, measured (the pre-flight log prints it)",
    )
    p.add_argument(
        "--tokens-per-record",
        type=float,
        default=DEFAULT_TOKENS_PER_RECORD,
        help="prompt + completion tokens a record costs, plus an LLM judge's "
        f"(default {DEFAULT_TOKENS_PER_RECORD})",
    )
    p.add_argument(
        "--thinking-tokens",
        type=float,
        default=0.0,
        help="a reasoning model's thinking tokens per record, about its thinking_token_budget: added to "
        "--tokens-per-record (vLLM counts the thinking inside max_tokens; default 0: not a reasoning model)",
    )
    concurrency = setting("concurrency").default  # a pool's, as the DAG param
    p.add_argument(
        "--concurrency", type=int, default=concurrency, help=f"shard jobs per worker (default {concurrency})"
    )


def _shard_args(p: argparse.ArgumentParser) -> None:
    """The shard size, the lanes, a job's commit unit, the slowest GPU and Airflow's map bound."""
    from airflow_batchinfer.run.sizing import DEFAULT_MAX_JOB_S, DEFAULT_MAX_MAP_LENGTH, DEFAULT_STRAGGLER
    from airflow_batchinfer.spec.settings import setting

    p.add_argument(
        "--records-per-shard",
        type=int,
        default=None,
        help="assess this shard size (default: choose it: jobs of at most --max-job-s)",
    )
    p.add_argument(
        "--max-job-s",
        type=float,
        default=DEFAULT_MAX_JOB_S,
        help="the longest shard job the chosen size allows, its GPU running --concurrency jobs "
        f"(default {DEFAULT_MAX_JOB_S:.0f})",
    )
    p.add_argument(
        "--lanes",
        type=int,
        default=0,
        help="the run setting lanes: tasks a round maps, each taking the next shard (default 0: a slot each)",
    )
    chunk = setting("chunk_size").default
    p.add_argument(
        "--chunk-size",
        type=int,
        default=chunk,
        help=f"records a job commits at a time: what a lost worker redoes per job (default {chunk})",
    )
    p.add_argument(
        "--straggler",
        type=float,
        default=DEFAULT_STRAGGLER,
        help=f"how many times slower the slowest GPU is (default {DEFAULT_STRAGGLER}; 1: none)",
    )
    p.add_argument(
        "--max-map-length",
        type=int,
        default=DEFAULT_MAX_MAP_LENGTH,
        help="Airflow's [core] max_map_length: the most lanes a round maps "
        f"(default {DEFAULT_MAX_MAP_LENGTH})",
    )


def _retry_args(p: argparse.ArgumentParser) -> None:
    """The judge's approval rate, the retry settings and each job's time bound."""
    p.add_argument(
        "--approval-rate",
        type=float,
        default=None,
        help="the judge's approval rate, 0-1 (the pre-flight measures it); default: one pass",
    )
    p.add_argument("--max-rounds", type=int, default=1, help="rounds that re-run the rejected (default 1)")
    p.add_argument("--strategy", choices=["rounds", "in_place", "hybrid"], default="rounds")
    p.add_argument("--max-attempts", type=int, default=3, help="in-place attempts a record (default 3)")
    p.add_argument(
        "--execution-timeout-hours",
        type=float,
        default=12.0,
        help="the DAG's execution_timeout, each shard job's bound; longer jobs and lanes get a note "
        "(default 12)",
    )


def _gate_args(p: argparse.ArgumentParser) -> None:
    """How long review gates wait, what a released gate keeps and the pool's idle_ttl_s
    (:mod:`~airflow_batchinfer.run.sizing_gates`)."""
    from airflow_batchinfer.run.sizing_gates import DEFAULT_GATE_KEEP_WARM_S
    from airflow_batchinfer.worker.settings import POOL_IDLE_TTL_S

    p.add_argument(
        "--review-delay",
        metavar="DURATION",
        default=None,
        help="how long people take to answer a review gate (seconds, or 45s, 30m, 12h, 1d): estimates "
        "per gate the GPU-hours idle under gate_idle keep vs release, and the rounds' tail idle",
    )
    p.add_argument(
        "--gate-keep-warm-s",
        type=float,
        default=DEFAULT_GATE_KEEP_WARM_S,
        help="with --review-delay: what a released gate keeps first, as the run setting gate_keep_warm_s "
        f"(default {DEFAULT_GATE_KEEP_WARM_S:.0f})",
    )
    p.add_argument(
        "--idle-ttl-s",
        type=float,
        default=float(POOL_IDLE_TTL_S),
        help="with --review-delay: the pool's idle_ttl_s, idle before it scales to zero "
        f"(default {POOL_IDLE_TTL_S})",
    )


def _input_records(uri: str, *, quiet: bool) -> int:
    """The records of ``uri``: a Parquet input's from its footers, else estimated (its stored bytes
    over one sample's bytes per record)."""
    from airflow_batchinfer.storage.input_parts import list_input
    from airflow_batchinfer.storage.part_plan import size_input

    size = size_input(list_input(uri))
    if not quiet:
        how = "from the footers" if size.exact else "estimated from one sample"
        stored = f"{size.parts} part(s), {size.bytes:,} bytes stored"
        print(f"input {uri}: {stored}, {size.records:,} records ({how})")
    return max(1, size.records)


def _cmd_plan(args: argparse.Namespace) -> dict[str, Any] | None:
    from airflow_batchinfer.engines.budget import record_tokens
    from airflow_batchinfer.run.sizing import plan_run

    if args.arms < 1:
        raise ConfigError(f"--arms must be >= 1 (1: no fan-out), got {args.arms}")
    if not args.thinking_tokens >= 0:
        raise ConfigError(
            f"--thinking-tokens must be >= 0 (0: not a reasoning model), got {args.thinking_tokens}"
        )
    records = args.records if args.input is None else _input_records(args.input, quiet=args.json)
    plan = plan_run(
        records * args.arms,
        args.gpus,
        args.tokens_per_s,
        concurrency=args.concurrency,
        tokens_per_record=record_tokens(args.tokens_per_record, args.thinking_tokens),
        max_map_length=args.max_map_length,
        lanes=args.lanes,
        chunk_size=args.chunk_size,
        max_job_s=args.max_job_s,
        straggler=args.straggler,
        records_per_shard=args.records_per_shard,
        approval_rate=args.approval_rate,
        max_rounds=args.max_rounds,
        strategy=args.strategy,
        max_attempts=args.max_attempts,
        execution_timeout_s=args.execution_timeout_hours * 3600,
        airflow_pool=args.airflow_pool,
    )
    gates = None
    if args.review_delay is not None:
        from airflow_batchinfer.run.sizing_gates import gate_idle, parse_delay

        delay = parse_delay(args.review_delay)
        gates = gate_idle(plan, delay, gate_keep_warm_s=args.gate_keep_warm_s, idle_ttl_s=args.idle_ttl_s)
    if args.json:
        return {**plan.to_dict(), **({"review_gates": gates.to_dict()} if gates else {})}
    print("\n".join([plan.table(), *(gates.lines() if gates else [])]))
    return None
