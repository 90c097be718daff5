"""``batchinfer pool``: a warm worker pool, local processes or a Kubernetes Deployment (``up``,
``status``, ``down``, ``metrics``, ``reap``, ``manifests``); :func:`pool_args` and :func:`pool_spec` serve
``batchinfer run`` too."""

from __future__ import annotations

import argparse
from typing import Any

from airflow_batchinfer.exceptions import ConfigError


def add_commands(sub: Any) -> None:
    """``pool`` and its subcommands."""
    pool = sub.add_parser(
        "pool", help="a warm worker pool: local processes or a Kubernetes Deployment"
    ).add_subparsers(dest="pool_command", required=True)
    p = pool.add_parser("up", help="start (or reuse) N workers and wait until ready")
    pool_args(p)
    _backend(p, spec=True)
    p.set_defaults(func=_cmd_pool_up)
    for name, helptext, fn in (
        ("status", "show the pool's workers (and leases, on Kubernetes)", _cmd_pool_status),
        ("down", "stop the pool's workers (Kubernetes: release this CLI's lease)", _cmd_pool_down),
        (
            "metrics",
            "print the pool's replicas, leases and busy workers as Prometheus text",
            _cmd_pool_metrics,
        ),
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
    pool_args(p)
    _backend(p, spec=True, only_kubernetes=True)
    p.add_argument("--no-namespace", action="store_true", help="leave the namespace to kustomize/kubectl")
    p.add_argument(
        "--no-network-policy",
        action="store_true",
        help="leave out the pool's NetworkPolicy (k8s/base ships one for every pool)",
    )
    p.set_defaults(func=_cmd_pool_manifests)


def pool_args(p: argparse.ArgumentParser, *, with_prefix: bool = True) -> None:
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


def pool_spec(
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
    urls = pool.up(pool_spec(args, args.allow_prefix, args.allow_callable, args.allow_adapter))
    return {"name": args.name, "workers": urls, "token_file": str(pool.dir / "token")}


def _cmd_pool_status(args: argparse.Namespace) -> dict[str, Any]:
    from airflow_batchinfer.pools import LocalPool

    if k8s := _kubernetes(args):
        return dict(k8s.status(args))
    return LocalPool(args.name).status()


def _cmd_pool_metrics(args: argparse.Namespace) -> None:
    """Prometheus text of the pool (:func:`~airflow_batchinfer.pools.prometheus.render_pool_metrics`):
    a local pool's workers report their jobs in its status; a Kubernetes pool's ready workers are
    asked (``/v1/stats``, the pool's token)."""
    from airflow_batchinfer.pools import LocalPool
    from airflow_batchinfer.pools.prometheus import render_pool_metrics

    if k8s := _kubernetes(args):
        pool = k8s.open_cli_pool(args)
        status, ref = pool.status(), str(pool)
        urls = [w["url"] for w in status["workers"] if w["url"] and w["ready"]]
        busy = _busy_workers(urls, pool.token())
        replicas, ready = status["replicas"], status["ready"]
    else:
        local = LocalPool(args.name)
        status, ref = local.status(), str(local)
        answered = [w for w in status["workers"] if "slots_busy" in w]
        busy = sum(1 for w in answered if w["slots_busy"]) if answered else None
        replicas = sum(1 for w in status["workers"] if w["alive"])
        ready = sum(1 for w in answered if w.get("ready"))
    leases = {k: int(v["replicas"]) for k, v in (status.get("leases") or {}).items()}
    print(render_pool_metrics(ref, replicas=replicas, ready=ready, leases=leases, busy=busy), end="")


def _busy_workers(urls: list[str], token: str | None) -> int | None:
    """Workers at ``urls`` running a job (``None``: none answered)."""
    from airflow_batchinfer.pools.busy import worker_busy

    answers = [b for b in (worker_busy(url, token) for url in urls) if b is not None]
    return sum(answers) if answers else None


def _cmd_pool_down(args: argparse.Namespace) -> dict[str, Any]:
    from airflow_batchinfer.pools import LocalPool

    if k8s := _kubernetes(args):
        return dict(k8s.down(args))
    return {"name": args.name, "stopped": LocalPool(args.name).down()}


def _cmd_pool_reap(args: argparse.Namespace) -> dict[str, Any]:
    return dict(_kubernetes(args).reap(args))


def _cmd_pool_manifests(args: argparse.Namespace) -> None:
    _kubernetes(args).manifests(args)
