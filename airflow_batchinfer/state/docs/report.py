"""The run report's ``report/summary.json`` (:class:`RunReport`), written by
:func:`airflow_batchinfer.run.report.build.build_report` with ``report.md`` and the plots: how the
run ended and why, each round's summary and shards, the reviews and the judge's calibration, the
pre-flight's projection, the workers' and engines' figures and the id invariant over the run."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import TypeAdapter

from airflow_batchinfer.state.docs.calibration import Calibration
from airflow_batchinfer.state.docs.io import DocModel, read_model
from airflow_batchinfer.state.docs.preflight import PreflightSummary
from airflow_batchinfer.state.docs.shard_status import RoundShards
from airflow_batchinfer.state.docs.summary import FailedShard, Summary
from airflow_batchinfer.state.docs.usage_account import UsageAccount
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage.json_doc import write_bytes
from airflow_batchinfer.storage.location import StorageOptions, join, resolve

RunStatus = Literal[
    "complete", "exhausted", "accepted_by_review", "stopped_by_review", "incomplete", "failed_shards"
]


class RunReport(DocModel):
    """A run's report. ``status``: how it ended (``stop_reason``: why); ``input``: the input's
    counts (its manifest's); ``fan_out``: a fan-out's arms and the rows round 0 planned; ``rounds``:
    each closed round's summary; ``plans``: what each slot decided (its plan without the settings
    its round ran, ``shards`` their count). ``approved``, ``accepted_by_review``,
    ``dropped_by_review``, ``remaining_pending`` (at ``remaining_pending_uri``) and
    ``exhausted_in_place`` account for every row; ``reviews``: what reviewers' decisions did per
    reviewed round, ``calibration`` the judge against them. ``shard_status``: each round's shards by
    state and lane; ``preflight``: the pre-flight's summary (none: it did not run); ``warnings``:
    what the settings warn of. ``workers`` and ``engine``: per worker and per round figures;
    ``invariant``: the id check over the run (``ok``, and how it was ``checked``). ``usage``: the
    run's GPU-seconds up to the report (:class:`~.usage_account.UsageAccount`; ``None``: a report
    written before they were accounted)."""

    run_root: str
    strategy: str
    status: RunStatus
    stop_reason: str
    input: dict[str, int] | None
    fan_out: dict[str, Any] | None
    rounds: list[Summary]
    plans: list[dict[str, Any]]
    approved: int
    accepted_by_review: int
    dropped_by_review: int
    reviews: list[dict[str, Any]]
    calibration: list[Calibration]
    remaining_pending: int
    remaining_pending_uri: str | None
    exhausted_in_place: int
    failed_shards: list[FailedShard]
    max_failed_shards: int
    shard_status: list[RoundShards]
    preflight: PreflightSummary | None
    warnings: list[str]
    workers: dict[str, dict[str, float]]
    engine: list[dict[str, Any]]
    invariant: dict[str, Any]
    usage: UsageAccount | None = None


_REPORT = TypeAdapter(RunReport)


def report_uri(layout: RunLayout) -> str:
    return join(layout.report, "summary.json")


def read_report(layout: RunLayout, so: StorageOptions | None = None) -> RunReport | None:
    """The run's report, or ``None`` before the report task wrote it."""
    return read_model(_REPORT, report_uri(layout), "run report", so)


def write_report_doc(layout: RunLayout, report: RunReport, so: StorageOptions | None = None) -> None:
    write_bytes(resolve(report_uri(layout), so), report.encode())
