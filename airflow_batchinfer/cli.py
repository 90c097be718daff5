"""``batchinfer``: the command line. Thin wiring only; the logic lives in the library modules."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from airflow_batchinfer import __version__
from airflow_batchinfer.exceptions import BatchInferError, ConfigError


def _storage_options(pairs: Sequence[str]) -> dict[str, Any]:
    """``--storage-option endpoint_url=http://127.0.0.1:8333`` → fsspec options (JSON values allowed)."""
    from airflow_batchinfer.worker.settings import parse_options

    return parse_options(list(pairs))


def _source_size(uri: str, options: dict[str, Any]) -> int | None:
    from airflow_batchinfer.storage import JsonlFile

    f = JsonlFile(uri, storage_options=options)
    return None if f.compressed else int(f.info().get("size") or 0) or None


def _cmd_shard(args: argparse.Namespace) -> dict[str, Any]:
    from airflow_batchinfer.progress import ProgressBar
    from airflow_batchinfer.storage import shard_dataset

    options = _storage_options(args.storage_option)
    with ProgressBar("shard", _source_size(args.src, options)) as bar:
        result = shard_dataset(
            args.src,
            args.dst,
            records_per_shard=args.records_per_shard,
            max_bytes_per_shard=args.max_bytes_per_shard,
            id_field=args.id_field,
            assign_ids=args.assign_ids,
            on_error=args.on_error,
            max_line_bytes=args.max_line_bytes,
            max_id_bytes=args.max_id_bytes,
            rejects=args.rejects,
            compression=args.compression,
            storage_options=options,
            overwrite=args.overwrite,
            progress=bar,
        )
    return {
        "dst": args.dst,
        "shards": len(result.shards),
        "counts": result.counts,
        "id_field": result.id_field,
        "rejects": result.rejects_uri,
        "reused": result.reused,
        "seconds": round(result.seconds, 3),
    }


def _cmd_recompact(args: argparse.Namespace) -> dict[str, Any]:
    from airflow_batchinfer.progress import ProgressBar
    from airflow_batchinfer.storage.recompact import recompact

    with ProgressBar("recompact") as bar:
        result = recompact(
            args.src,
            args.dst,
            records_per_shard=args.records_per_shard,
            max_bytes_per_shard=args.max_bytes_per_shard,
            workers=args.workers,
            compression=args.compression,
            storage_options=_storage_options(args.storage_option),
            overwrite=args.overwrite,
            progress=bar,
        )
    return {
        "dst": args.dst,
        "shards": len(result.shards),
        "records": result.records,
        "sources": result.sources,
        "reused": result.reused,
        "seconds": round(result.seconds, 3),
    }


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``batchinfer`` parser; with ``command="worker"``, that command's alone: a worker's start
    (``worker serve``) then imports none of the run's settings, the pools or the Kubernetes commands."""
    parser = argparse.ArgumentParser(prog="batchinfer", description="LLM batch inference at scale.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    if command == "worker":
        _worker_parser(sub)
        return parser

    from airflow_batchinfer.spec.settings import add_run_arguments, setting
    from airflow_batchinfer.storage.jsonl_dir import DEFAULT_BYTES_PER_SHARD

    def common(p: argparse.ArgumentParser) -> None:
        rps = setting("records_per_shard")
        p.add_argument(
            "--records-per-shard",
            type=rps.flag_kwargs()["type"],
            default=rps.default,
            help=f"records per shard (default {rps.default:,}, as a run's records_per_shard)",
        )
        p.add_argument(
            "--max-bytes-per-shard",
            type=int,
            default=DEFAULT_BYTES_PER_SHARD,
            help="uncompressed bytes per shard (default 256 MiB)",
        )
        p.add_argument("--compression", choices=["zstd", "none"], default="zstd")
        p.add_argument(
            "--overwrite", action="store_true", help="replace shards in DST that another run wrote"
        )
        p.add_argument(
            "--storage-option",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="fsspec option, e.g. endpoint_url=http://127.0.0.1:8333 (repeatable); "
            "credentials default to the environment",
        )

    p = sub.add_parser("shard", help="split one JSONL(.zst) file into part-NNNNN.jsonl.zst shards")
    p.add_argument("src", help="input file: path or URI (.jsonl, .jsonl.zst)")
    p.add_argument("dst", help="output directory: path or URI")
    common(p)
    p.add_argument(
        "--id-field", default=None, help="unique id field (default: id, or custom_id for OpenAI batch files)"
    )
    p.add_argument("--assign-ids", action="store_true", help="give records without an id '<file>:<line>'")
    p.add_argument("--on-error", choices=["quarantine", "raise", "skip"], default="quarantine")
    p.add_argument("--rejects", default=None, help="where bad lines go (default: rejects/ beside DST)")
    for bound in (setting("max_line_bytes"), setting("max_id_bytes")):  # as a run's input bounds
        p.add_argument(str(bound.flag), **bound.flag_kwargs())
    p.set_defaults(func=_cmd_shard)

    p = sub.add_parser("recompact", help="rewrite a directory of small shards into full shards")
    p.add_argument("src", help="directory of shards: path or URI")
    p.add_argument("dst", help="output directory: path or URI")
    common(p)
    p.add_argument("--workers", type=int, default=4, help="parallel writers (default 4)")
    p.set_defaults(func=_cmd_recompact)

    _worker_parser(sub)

    pool = sub.add_parser(
        "pool", help="a warm worker pool: local processes or a Kubernetes Deployment"
    ).add_subparsers(dest="pool_command", required=True)
    p = pool.add_parser("up", help="start (or reuse) N workers and wait until ready")
    _pool_args(p)
    _backend(p, spec=True)
    p.set_defaults(func=_cmd_pool_up)
    for name, helptext, fn in (
        ("status", "show the pool's workers (and leases, on Kubernetes)", _cmd_pool_status),
        ("down", "stop the pool's workers (Kubernetes: release this CLI's lease)", _cmd_pool_down),
    ):
        p = pool.add_parser(name, help=helptext)
        p.add_argument("--name", default="default")
        _backend(p, spec=False)
        p.set_defaults(func=fn)
        if name == "down":
            p.add_argument(
                "--lease", default=None, help="Kubernetes: the lease to release (default cli:USER@HOST)"
            )
            p.add_argument(
                "--now", action="store_true", help="Kubernetes: scale to zero now if no run holds it"
            )
            p.add_argument(
                "--force", action="store_true", help="Kubernetes: scale to zero even if runs hold it"
            )
            p.add_argument("--delete", action="store_true", help="Kubernetes: remove the pool's objects")
    p = pool.add_parser("reap", help="Kubernetes: apply idle_ttl/scaledown_ttl to every pool in a namespace")
    _backend(p, spec=False, only_kubernetes=True)
    p.set_defaults(func=_cmd_pool_reap)
    p = pool.add_parser("manifests", help="Kubernetes: print the pool's objects as YAML (GitOps)")
    _pool_args(p)
    _backend(p, spec=True, only_kubernetes=True)
    p.add_argument("--no-namespace", action="store_true", help="leave the namespace to kustomize/kubectl")
    p.add_argument(
        "--no-network-policy",
        action="store_true",
        help="leave out the pool's NetworkPolicy (k8s/base ships one for every pool)",
    )
    p.set_defaults(func=_cmd_pool_manifests)

    p = sub.add_parser("run", help="run the round pipeline on a local pool, without Airflow")
    p.add_argument("input", **setting("input").flag_kwargs())
    p.add_argument("run_root", help="the run's directory (a DAG's output_root/run_name): path or URI")
    _pool_args(p, with_prefix=False)
    add_run_arguments(p, positionals=False)  # the run settings: flags, defaults and help
    p.add_argument(
        "--worker-url",
        action="append",
        default=[],
        help="use these running workers (a static pool) instead of a local pool (repeatable); "
        "token from --token-file or $BATCHINFER_WORKER_TOKEN",
    )
    p.add_argument("--token-file", default=None)
    p.add_argument(
        "--kubernetes-pool",
        default=None,
        metavar="NAMESPACE/NAME",
        help="run on this Kubernetes pool (made with `pool up --backend kubernetes`): leased for the "
        "run with --replicas workers, workers found as they come and go ($KUBECONFIG or in-cluster)",
    )
    p.set_defaults(func=_cmd_run)

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

    p = sub.add_parser("plan", help="size a run before spending: shards, lanes, wall, tail, GPU-hours, pool")
    _plan_args(p)
    p.set_defaults(func=_cmd_plan)
    return parser


def _worker_parser(sub: Any) -> None:
    """``batchinfer worker serve``, with the flags of :mod:`airflow_batchinfer.worker.settings`."""
    from airflow_batchinfer.worker.settings import add_worker_arguments

    worker = sub.add_parser("worker", help="the warm worker process").add_subparsers(
        dest="worker_command", required=True
    )
    p = worker.add_parser("serve", help="serve shard jobs over HTTP (model loaded once)")
    add_worker_arguments(p)  # each flag also reads BATCHINFER_WORKER_<FLAG> (containers)
    p.set_defaults(func=_cmd_worker_serve)


def _plan_args(p: argparse.ArgumentParser) -> None:
    from airflow_batchinfer.run.sizing import (
        DEFAULT_MAX_JOB_S,
        DEFAULT_MAX_MAP_LENGTH,
        DEFAULT_STRAGGLER,
        DEFAULT_TOKENS_PER_RECORD,
    )
    from airflow_batchinfer.spec.settings import setting

    p.add_argument("--records", type=int, required=True, help="records in the dataset")
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
    concurrency = setting("concurrency").default  # a pool's, as the DAG param
    p.add_argument(
        "--concurrency", type=int, default=concurrency, help=f"shard jobs per worker (default {concurrency})"
    )
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
    p.add_argument("--airflow-pool", default="batchinfer", help="Airflow pool name for the printed command")
    p.add_argument("--json", action="store_true", help="print the plan as JSON instead of a table")


def _cmd_plan(args: argparse.Namespace) -> dict[str, Any] | None:
    from airflow_batchinfer.run.sizing import plan_run

    if args.arms < 1:
        raise ConfigError(f"--arms must be >= 1 (1: no fan-out), got {args.arms}")
    plan = plan_run(
        args.records * args.arms,
        args.gpus,
        args.tokens_per_s,
        concurrency=args.concurrency,
        tokens_per_record=args.tokens_per_record,
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
    if args.json:
        return plan.to_dict()
    print(plan.table())
    return None


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


def _pool_args(p: argparse.ArgumentParser, *, with_prefix: bool = True) -> None:
    """The pool's settings: the workers' own flags (``worker serve``), with the DAG params' defaults."""
    from airflow_batchinfer.spec.settings import setting
    from airflow_batchinfer.worker.settings import worker_setting

    def helped(name: str) -> str:  # a DAG param's help and default
        s = setting(name)
        return f"{s.help} (default {s.default})".replace("%", "%%")

    def flag(name: str) -> str:  # the worker's flag of the setting a pool passes on to its workers
        return worker_setting(name).flag

    p.add_argument(
        "--name", default="default", help="pool name (state under ~/.cache/airflow-batchinfer/pools)"
    )
    engine = worker_setting("engine")
    p.add_argument(
        engine.flag,
        default=engine.default,
        choices=list(engine.choices),
        help=f"the engine the workers run (default {engine.default}: no model needed; a DAG's engine param "
        f"defaults to {setting('engine').default})",
    )
    p.add_argument(
        flag("model"),
        default=worker_setting("model").default,
        help="a model directory on the workers (vllm, transformers) or a model name (openai); "
        "default none, for the simulated engine",
    )
    p.add_argument(
        flag("engine_options"),
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="engine argument (repeatable), e.g. max_model_len=4096",
    )
    for name in ("replicas", "concurrency", "target_batch_tokens"):
        option = "--replicas" if name == "replicas" else flag(name)  # replicas: the pool's, not a worker's
        p.add_argument(option, type=int, default=setting(name).default, help=helped(name))
    idle = setting("idle_ttl_s")
    p.add_argument(flag("idle_ttl_s"), type=float, default=float(idle.default), help=helped(idle.name))
    if with_prefix:
        p.add_argument(
            flag("allowed_prefixes"), action="append", required=True, help="storage prefix jobs may use"
        )
        for name in ("allowed_callables", "allowed_adapters"):  # the workers' allow-lists, passed on
            allowed = worker_setting(name)
            p.add_argument(
                allowed.flag,
                action="append",
                default=[],
                metavar=allowed.metavar,
                help=f"{allowed.help} (repeatable)".replace("%", "%%"),
            )


def _backend(p: argparse.ArgumentParser, *, spec: bool, only_kubernetes: bool = False) -> None:
    from airflow_batchinfer.pools.kubernetes.commands import add_arguments  # no client needed

    choices = ["kubernetes"] if only_kubernetes else ["local", "kubernetes"]
    p.add_argument("--backend", choices=choices, default=choices[0])
    add_arguments(p, spec=spec)


def _kubernetes(args: argparse.Namespace) -> Any:
    """The Kubernetes commands (``None`` for the local backend); the client is an optional extra."""
    if args.backend != "kubernetes":
        return None
    try:
        import kubernetes  # noqa: F401 - the client the commands use
    except ImportError as exc:  # pragma: no cover - the extra is missing
        raise ConfigError(
            f"the kubernetes backend needs: pip install 'airflow-batchinfer[kubernetes]' ({exc})"
        ) from exc
    from airflow_batchinfer.pools.kubernetes import commands

    return commands


def _pool_spec(
    args: argparse.Namespace, prefixes: list[str], callables: list[str], adapters: list[str]
) -> Any:
    from airflow_batchinfer.pools import LocalPoolSpec
    from airflow_batchinfer.worker.settings import parse_options

    return LocalPoolSpec(
        engine=args.engine,
        model=args.model,
        engine_options=parse_options(args.engine_arg),
        replicas=args.replicas,
        concurrency=args.concurrency,
        idle_ttl_s=args.idle_ttl,
        allowed_prefixes=tuple(prefixes),
        target_batch_tokens=args.target_batch_tokens,
        allowed_callables=tuple(callables),
        allowed_adapters=tuple(adapters),
    )


def _cmd_pool_up(args: argparse.Namespace) -> dict[str, Any]:
    from airflow_batchinfer.pools import LocalPool

    if k8s := _kubernetes(args):
        return dict(k8s.up(args))
    pool = LocalPool(args.name)
    urls = pool.up(_pool_spec(args, args.allow_prefix, args.allow_callable, args.allow_adapter))
    return {"name": args.name, "workers": urls, "token_file": str(pool.dir / "token")}


def _cmd_pool_status(args: argparse.Namespace) -> dict[str, Any]:
    from airflow_batchinfer.pools import LocalPool

    if k8s := _kubernetes(args):
        return dict(k8s.status(args))
    return LocalPool(args.name).status()


def _cmd_pool_down(args: argparse.Namespace) -> dict[str, Any]:
    from airflow_batchinfer.pools import LocalPool

    if k8s := _kubernetes(args):
        return dict(k8s.down(args))
    return {"name": args.name, "stopped": LocalPool(args.name).down()}


def _cmd_pool_reap(args: argparse.Namespace) -> dict[str, Any]:
    return dict(_kubernetes(args).reap(args))


def _cmd_pool_manifests(args: argparse.Namespace) -> None:
    _kubernetes(args).manifests(args)


def _cmd_run(args: argparse.Namespace) -> dict[str, Any]:
    import asyncio

    from airflow_batchinfer.pools import LocalPool, PoolRef, StaticPool, WorkerPool, open_backend
    from airflow_batchinfer.progress import ProgressBar
    from airflow_batchinfer.rpc.pool import PoolClient
    from airflow_batchinfer.run.pipeline import run_pipeline
    from airflow_batchinfer.run.preflight import retry_warnings
    from airflow_batchinfer.spec.limits import callable_targets, judge_pool_refusal
    from airflow_batchinfer.spec.settings import run_settings_from_args
    from airflow_batchinfer.state.config import RunConfig
    from airflow_batchinfer.storage.location import parent

    cfg = RunConfig(run_root=args.run_root, **run_settings_from_args(args))
    for warning in retry_warnings(cfg):  # the pre-flight's, of the settings alone
        print(f"batchinfer run: warning: {warning}", file=sys.stderr)
    # The run holds a lease on its pool for as long as it lives (a no-op for a static pool).
    lease = f"cli-run:{args.run_root}"
    judge_ref = PoolRef.parse(cfg.judge_pool) if cfg.judge_pool else None
    ref = f"kubernetes://{args.kubernetes_pool}" if args.kubernetes_pool else f"local://{args.name}"
    own = None if args.worker_url else ref  # a static pool: URLs, not a reference
    if why := judge_pool_refusal(cfg.judge_pool, own):
        raise ConfigError(f"--judge-pool: {why}")
    pool: WorkerPool
    if args.worker_url:
        from airflow_batchinfer.worker.config import load_token

        pool = StaticPool(urls=args.worker_url, rpc_token=load_token(args.token_file))
    elif args.kubernetes_pool:
        kpool: Any = open_backend(PoolRef.parse("kubernetes://" + args.kubernetes_pool))
        kpool.acquire(lease, args.replicas)
        kpool.wait_ready(args.replicas)
        pool = kpool
    else:
        local = LocalPool(args.name)
        # the run's own judge callables and adapters: whoever runs the CLI chose them
        callables, adapters = callable_targets(cfg.judge), list(cfg.adapters.values())
        local.up(_pool_spec(args, [args.run_root, parent(args.input)], callables, adapters), lease_id=lease)
        pool = local
    bars: dict[str, ProgressBar] = {}

    def progress(phase: str, done: int, total: int) -> None:
        bar = bars.get(phase)
        if bar is None:
            for old in bars.values():
                old.close()
            bars.clear()
            bar = bars[phase] = ProgressBar(phase, total, unit="rec")
        bar(done - bar.records, done - bar.records)

    judge_pool: Any = None
    if judge_ref is not None:  # a running pool (`pool up`), leased as it is
        judge_pool = open_backend(judge_ref)
        judge_pool.acquire(lease, 1)
        if judge_pool.backend == "kubernetes":
            judge_pool.wait_ready(1)  # scaled to zero while idle: up again before any shard is judged

    async def go() -> dict[str, Any]:
        grace = cfg.unreachable_grace_s  # a silent worker that may run a job holds its copy back
        client = PoolClient.for_pool(pool, lease_id=lease, unreachable_grace_s=grace)
        judge: PoolClient | None = None
        if judge_pool is not None:
            judge = PoolClient.for_pool(judge_pool, lease_id=lease, unreachable_grace_s=grace)
        try:
            return await run_pipeline(cfg, client, judge_pool=judge, progress=progress)
        finally:
            await client.aclose()
            if judge is not None:
                await judge.aclose()

    try:
        return asyncio.run(go())
    finally:
        for bar in bars.values():
            bar.close()
        pool.release(lease)
        if judge_pool is not None:
            judge_pool.release(lease)


def _cmd_worker_serve(args: argparse.Namespace) -> None:
    from airflow_batchinfer.worker.config import WorkerConfig
    from airflow_batchinfer.worker.server import serve
    from airflow_batchinfer.worker.settings import settings_from_args

    config = WorkerConfig.from_settings(settings_from_args(args))
    if config.allowed_prefixes == []:
        from airflow_batchinfer.worker.security import PrefixPolicy

        PrefixPolicy([])  # raises the explanatory error
    serve(config)


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


if __name__ == "__main__":
    sys.exit(main())
