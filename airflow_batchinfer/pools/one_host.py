"""Where a local pool can work: on one host with every task and trigger that calls it.

A local pool's workers listen on 127.0.0.1 and keep their state and token on that host's disk, so
the pool setup refuses a local pool under an executor that may run tasks elsewhere, unless the
deployment says every component is on one host (``[batchinfer] one_host = True``;
docs/deployment.md). :func:`one_host_refusal` is that decision, a pure function of what the caller
read from Airflow's config.

Standard library only (the package's ``__init__`` is lazy): ``get_provider_info`` declares the
option in every Airflow process, which must not load the pools.
"""

from __future__ import annotations

# ``[batchinfer] one_host = True``: every component of the deployment runs on one host, whatever the
# executor, so local pools may be used
ONE_HOST_OPTION = "one_host"
# Why a local pool needs one host, said wherever one is refused or not found.
ONE_HOST = (
    "A local pool's workers listen on 127.0.0.1 of the host that started them and its state and token "
    "are on that host's disk, so local pools need the tasks, the triggerer and the workers on one host "
    "(LocalExecutor). With Celery or Kubernetes executors, or several triggerers on other hosts, use a "
    "static pool (a batchinfer_pool connection listing each worker's own URL) or a Kubernetes pool "
    "(kubernetes://NAMESPACE/NAME); see the deployment guide (docs/deployment.md)."
)
# Executors that run every task on the scheduler's host.
ONE_HOST_EXECUTORS = frozenset({"LocalExecutor", "SequentialExecutor", "DebugExecutor"})


def executor_name(configured: str) -> str:
    """The class name of one ``[core] executor`` entry: ``LocalExecutor``, an import path
    (``airflow.providers.celery.executors.celery_executor.CeleryExecutor``) or ``alias:path``."""
    return configured.strip().rsplit(":", 1)[-1].rsplit(".", 1)[-1]


def one_host_refusal(pool: str, executors: str, *, one_host: bool = False) -> str | None:
    """Why ``pool`` (a local pool) cannot run under ``executors`` (``[core] executor``, a
    comma-separated list), or ``None``. ``one_host``: the deployment says every component runs on
    one host (``[batchinfer] one_host = True``) whatever the executor. Pure: the pool setup
    decides with it before it starts anything."""
    named = (executor_name(x) for x in executors.split(",") if x.strip())
    others = [e for e in named if e not in ONE_HOST_EXECUTORS]
    if one_host or not others:
        return None
    return (
        f"{pool} cannot run on this Airflow: its executor {', '.join(others)} may run tasks on other "
        f"hosts than the one that starts the workers. {ONE_HOST} If every component does run on this "
        f"one host, set [batchinfer] {ONE_HOST_OPTION} = True."
    )
