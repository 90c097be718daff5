"""``batchinfer run``: the round pipeline on a local, static or Kubernetes pool, without Airflow."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from airflow_batchinfer.cli.pool import pool_args, pool_spec
from airflow_batchinfer.exceptions import ConfigError

if TYPE_CHECKING:  # imported when the command runs: a worker's start loads none of them
    from airflow_batchinfer.pools import PoolRef, WorkerPool
    from airflow_batchinfer.state.config import RunConfig


def add_commands(sub: Any) -> None:
    """``run``: the input, the run root, the pool's flags and the run settings'."""
    from airflow_batchinfer.spec.settings import add_run_arguments, setting

    p = sub.add_parser("run", help="run the round pipeline on a local pool, without Airflow")
    p.add_argument("input", **setting("input").flag_kwargs())
    p.add_argument("run_root", help="the run's directory (a DAG's output_root/run_name): path or URI")
    pool_args(p, with_prefix=False)
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


def _cmd_run(args: argparse.Namespace) -> dict[str, Any]:
    import asyncio

    from airflow_batchinfer.pools import PoolRef
    from airflow_batchinfer.run.preflight import retry_warnings
    from airflow_batchinfer.run.usage_events import record_lease
    from airflow_batchinfer.spec.limits import judge_pool_refusal
    from airflow_batchinfer.spec.settings import run_settings_from_args
    from airflow_batchinfer.state.config import RunConfig

    cfg = RunConfig.of(run_root=args.run_root, **run_settings_from_args(args))
    for warning in retry_warnings(cfg):  # the pre-flight's, of the settings alone
        print(f"batchinfer run: warning: {warning}", file=sys.stderr)
    # The run holds a lease on its pool for as long as it lives (a no-op for a static pool).
    lease = f"cli-run:{args.run_root}"
    judge_ref = PoolRef.parse(cfg.judging.judge_pool) if cfg.judging.judge_pool else None
    ref = f"kubernetes://{args.kubernetes_pool}" if args.kubernetes_pool else f"local://{args.name}"
    own = None if args.worker_url else ref  # a static pool: URLs, not a reference
    if why := judge_pool_refusal(cfg.judging.judge_pool, own):
        raise ConfigError(f"--judge-pool: {why}")
    pool = _open_pool(args, cfg, lease)
    bars = _Bars()
    judge_pool = _open_judge_pool(judge_ref, lease)
    # what the run leases, as usage events (its GPU-seconds; a static pool is not leased)
    pools = [] if args.worker_url else [(pool, args.replicas), (judge_pool, 1)]
    leased = [(str(p), n) for p, n in pools if p is not None]
    for ref_, replicas in leased:
        record_lease(args.run_root, ref_, replicas)
    try:
        return asyncio.run(_pipeline(cfg, pool, judge_pool, lease, bars))
    finally:
        bars.close()
        pool.release(lease)
        if judge_pool is not None:
            judge_pool.release(lease)
        for ref_, _ in leased:
            record_lease(args.run_root, ref_, 0)


def _open_pool(args: argparse.Namespace, cfg: RunConfig, lease: str) -> WorkerPool:
    """The run's pool, leased: the static pool of ``--worker-url``, the Kubernetes pool of
    ``--kubernetes-pool`` (its workers ready), or a local pool started for the run."""
    from airflow_batchinfer.pools import LocalPool, PoolRef, StaticPool, open_backend
    from airflow_batchinfer.spec.limits import callable_targets
    from airflow_batchinfer.storage.input_parts import input_prefix

    if args.worker_url:
        from airflow_batchinfer.worker.config import load_token

        return StaticPool(urls=args.worker_url, rpc_token=load_token(args.token_file))
    if args.kubernetes_pool:
        kpool: Any = open_backend(PoolRef.parse("kubernetes://" + args.kubernetes_pool))
        kpool.acquire(lease, args.replicas)
        kpool.wait_ready(args.replicas)
        ready: WorkerPool = kpool
        return ready
    local = LocalPool(args.name)
    # the run's own judge callables and adapters: whoever runs the CLI chose them
    callables, adapters = callable_targets(cfg.judging.judge), list(cfg.prompt.adapters.values())
    local.up(pool_spec(args, [args.run_root, input_prefix(args.input)], callables, adapters), lease_id=lease)
    return local


def _open_judge_pool(judge_ref: PoolRef | None, lease: str) -> Any:
    """The judge's own pool (``None``: none), a running one (``pool up``) leased as it is."""
    from airflow_batchinfer.pools import open_backend

    if judge_ref is None:
        return None
    judge_pool: Any = open_backend(judge_ref)
    judge_pool.acquire(lease, 1)
    if judge_pool.backend == "kubernetes":
        judge_pool.wait_ready(1)  # scaled to zero while idle: up again before any shard is judged
    return judge_pool


class _Bars:
    """The pipeline's progress: one bar per phase, the previous one closed when the next begins."""

    def __init__(self) -> None:
        from airflow_batchinfer.progress import ProgressBar

        self._bar = ProgressBar
        self.bars: dict[str, Any] = {}

    def __call__(self, phase: str, done: int, total: int) -> None:
        bar = self.bars.get(phase)
        if bar is None:
            self.close()
            bar = self.bars[phase] = self._bar(phase, total, unit="rec")
        bar(done - bar.records, done - bar.records)

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()
        self.bars.clear()


async def _pipeline(
    cfg: RunConfig, pool: WorkerPool, judge_pool: Any, lease: str, progress: _Bars
) -> dict[str, Any]:
    """The rounds, through clients of the run's pool and the judge's, closed at the end."""
    from airflow_batchinfer.rpc.pool import PoolClient
    from airflow_batchinfer.run.pipeline import RunLease, run_pipeline

    grace = cfg.sharding.unreachable_grace_s  # a silent worker that may run a job holds its copy back
    client = PoolClient.for_pool(pool, lease_id=lease, unreachable_grace_s=grace)
    judge: PoolClient | None = None
    if judge_pool is not None:
        judge = PoolClient.for_pool(judge_pool, lease_id=lease, unreachable_grace_s=grace)
    try:
        held = RunLease(pool, lease)
        return await run_pipeline(cfg, client, judge_pool=judge, progress=progress, lease=held)
    finally:
        await client.aclose()
        if judge is not None:
            await judge.aclose()
