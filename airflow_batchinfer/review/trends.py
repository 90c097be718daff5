"""The run's trend over its closed rounds, as the review desk shows it: from each round's
``summary.json`` (:func:`trend`), and its plot (:func:`trend_chart`)."""

from __future__ import annotations

from typing import Any

from airflow_batchinfer.charts import Series, bar_chart, line_chart, side_by_side
from airflow_batchinfer.state.docs import read_summary
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage.location import StorageOptions

__all__ = ["TREND_FIELDS", "trend", "trend_chart"]

TREND_FIELDS = (
    "round",
    "slot",
    "mode",
    "pending",
    "approved",
    "rejected",
    "exhausted",
    "inference_errors",
    "failed_records",
    "next_pending",
    "approval_rate",
)


def trend(run_root: str, so: StorageOptions | None = None) -> list[dict[str, Any]]:
    """Per closed round, from its ``summary.json``: round, slot, mode, pending, approved, rejected (in
    place: exhausted), inference errors, failed records, next pending and approval rate, as far as
    the summary has them. Rounds in order, up to the first one not closed."""
    layout = RunLayout(run_root)
    out = []
    r = 0
    while (summary := read_summary(layout, r, so)) is not None:
        stored = summary.to_json()  # the fields it has (a mode's own; none added since it was written)
        out.append({k: stored[k] for k in TREND_FIELDS if k in stored})
        r += 1
    return out


def trend_chart(rows: list[dict[str, Any]]) -> str:
    """The trend plot: records pending and approved per closed round, and the approval rate."""

    rounds = [row.get("round") for row in rows]
    counts = bar_chart(
        rounds,
        [
            Series("pending", [row.get("pending") for row in rows], color="#bbb"),
            Series("approved", [row.get("approved") for row in rows], color="#2a7"),
        ],
        overlay=True,
        title="records per round",
        x_label="round",
    )
    rate = line_chart(
        rounds,
        [Series("approval rate", [row.get("approval_rate") for row in rows], color="#1f77b4")],
        title="approval rate",
        x_label="round",
        y_range=(0, 1),
    )
    return side_by_side(counts, rate)
