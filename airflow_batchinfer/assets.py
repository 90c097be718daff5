"""The results asset: one Airflow :class:`~airflow.sdk.Asset` per factory DAG, updated by each run of
it that succeeds, so that a downstream DAG can be scheduled on a run's results::

    from airflow.sdk import DAG, task
    from airflow_batchinfer import results_asset

    RESULTS = results_asset("my_batch_dag")  # the dag_id given to build_batch_inference_dag

    with DAG("train_on_results", schedule=[RESULTS]):

        @task
        def train(*, triggering_asset_events=None):
            for event in triggering_asset_events[RESULTS]:  # one per run since the last trigger
                print(event.extra["results"], event.extra["approved"])

        train()

The asset is declared when the DAG file is parsed, before any run root exists (a run's root is its
params' ``output_root`` and ``run_name``, pinned by its first task), so it names the DAG, not a
location: ``x-batchinfer://<dag_id>/results``. Each event's ``extra`` (:func:`results_event`) says
where that run's results are. The ``x-`` scheme is Airflow's mark of a scheme without a normaliser:
with ``s3://`` or ``file://``, every parse of the DAG file (every task start) would import each
provider's asset handlers (boto3: 0.16 s).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow.sdk import Asset, AssetAlias

from airflow_batchinfer.state.layout import RunLayout

SCHEME = "x-batchinfer"


def results_asset(dag_id: str) -> Asset:
    """The asset that a run of the factory DAG ``dag_id`` updates when it succeeds (its report
    task's outlet, or the close that writes the report); schedule a DAG on it with
    ``schedule=[results_asset(dag_id)]``. A failed run emits no event."""
    return Asset(name=f"batchinfer_results__{dag_id}", uri=f"{SCHEME}://{dag_id}/results")


def results_alias(dag_id: str) -> AssetAlias:
    """The alias through which a round's close emits the event on :func:`results_asset` when it
    finds the run finished and writes the report itself (the report task is then skipped): an alias
    emits only what the task adds to it, so a close that does not finish the run emits nothing."""
    return AssetAlias(name=f"batchinfer_results__{dag_id}__folded")


def results_event(report: Mapping[str, Any], output_format: str = "jsonl") -> dict[str, Any]:
    """The ``extra`` of a results event, from the run's report (``report/summary.json``): where the
    run and its results are, their ``format`` (the run's ``output_format``: which reader a downstream
    task uses), how it ended and its counts. Locations, counts and the format, no other setting (a
    run's settings may name Secrets or private prompts; every viewer of the asset sees its events).

    ``rounds`` counts the round slots that ran and closed (the tail's included); ``approved`` the
    rows the judge or a reviewer approved, and ``accepted_by_review`` those a reviewer's "Accept
    remaining" took as they were: ``results/`` holds both (docs: Accounting and the id invariant)."""
    run_root = str(report["run_root"])
    return {
        "run_root": run_root,
        "results": RunLayout(run_root).results,
        "format": output_format,
        "status": report["status"],
        "stop_reason": report["stop_reason"],
        "rounds": len(report["rounds"]),
        "approved": report["approved"],
        "accepted_by_review": report["accepted_by_review"],
        "remaining_pending": report["remaining_pending"],
    }
