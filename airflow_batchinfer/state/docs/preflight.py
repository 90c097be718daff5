"""The pre-flight's ``preflight/summary.json`` (:class:`PreflightSummary`): what a small sample run
through infer and judge on the warm pool measured, and what it projects for the whole run. Written
by :func:`airflow_batchinfer.run.preflight.run_preflight`; the report reads it."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from airflow_batchinfer.state.docs.io import DocModel, read_model
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage.json_doc import write_bytes
from airflow_batchinfer.storage.location import StorageOptions, join, resolve


class PreflightSummary(DocModel):
    """The sample's figures (``sample_records`` through the jobs the rounds run, in
    ``sample_wall_s``; ``tokens_per_s``, ``approval_rate``) and the projection over the
    ``dataset_records`` (``expected_passes_per_record`` over the expected rounds; the wall time and
    GPU-hours on ``workers``, against ``budget_gpu_hours``). ``sizing``: the sizing plan from the
    measured rates (:meth:`airflow_batchinfer.run.sizing.SizingPlan.to_dict`, with its own
    ``version``), or ``{"error": why}`` when the run cannot be sized; ``warnings``: what the run's
    settings warn of."""

    sample_records: int
    dataset_records: int
    tokens_per_s: float
    approval_rate: float
    expected_passes_per_record: float
    workers: int
    projected_wall_s: float
    projected_gpu_hours: float
    budget_gpu_hours: float | None
    sample_wall_s: float
    note: str
    sizing: dict[str, Any]
    warnings: list[str]


_PREFLIGHT = TypeAdapter(PreflightSummary)


def preflight_uri(layout: RunLayout) -> str:
    return join(layout.preflight, "summary.json")


def read_preflight(layout: RunLayout, so: StorageOptions | None = None) -> PreflightSummary | None:
    """The run's pre-flight summary, or ``None`` when none ran (``preflight_records`` 0, the CLI)."""
    return read_model(_PREFLIGHT, preflight_uri(layout), "preflight summary", so)


def write_preflight(layout: RunLayout, doc: PreflightSummary, so: StorageOptions | None = None) -> None:
    write_bytes(resolve(preflight_uri(layout), so), doc.encode())
