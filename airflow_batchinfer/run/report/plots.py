"""The run report's SVG plots, drawn with :mod:`~airflow_batchinfer.charts`."""

from __future__ import annotations

from typing import Any

from airflow_batchinfer import charts
from airflow_batchinfer.review.calibration import calibration_chart
from airflow_batchinfer.state.docs.calibration import Calibration

_PANEL = (420, 300)  # one chart's width and height, in pixels; a plot file holds two side by side


def plots(report: dict[str, Any]) -> dict[str, bytes]:
    """SVG plots (:mod:`~airflow_batchinfer.charts`, no plotting library): ``rounds.svg`` (records
    pending and approved per round; tokens per job-second) and ``workers.svg`` (average batch fill;
    engine busy over job time, per worker). A round without job time has no throughput point."""
    rounds = report["rounds"]
    xs = [s["round"] for s in rounds]
    records = charts.bar_chart(
        xs,
        [
            charts.Series("pending", [s["pending"] for s in rounds], color="#bbb"),
            charts.Series("approved", [s["approved"] for s in rounds], color="#2a7"),
        ],
        overlay=True,
        title="records per round",
        x_label="round",
        width=_PANEL[0],
        height=_PANEL[1],
    )
    tput = [sum(s["tokens"].values()) / s["job_seconds"] if s["job_seconds"] else None for s in rounds]
    throughput = charts.line_chart(
        xs,
        [charts.Series("tokens / job-second", tput)],
        title="tokens / job-second (infer + judge)",
        x_label="round",
        width=_PANEL[0],
        height=_PANEL[1],
    )
    workers = report["workers"]
    names = [n[-12:] for n in workers]
    fill = charts.bar_chart(
        names,
        [charts.Series("average batch fill", [w["avg_fill"] for w in workers.values()])],
        y_range=(0, 1.1),
        title="average batch fill",
        width=_PANEL[0],
        height=_PANEL[1],
    )
    busy = [w["engine_busy_s"] / w["job_seconds"] if w["job_seconds"] else None for w in workers.values()]
    engine = charts.bar_chart(
        names,
        [charts.Series("engine busy / job time", busy)],
        title="engine busy / job time",
        width=_PANEL[0],
        height=_PANEL[1],
    )
    out = {
        "rounds.svg": charts.side_by_side(records, throughput).encode(),
        "workers.svg": charts.side_by_side(fill, engine).encode(),
    }
    if report.get("calibration"):
        docs = [Calibration.model_validate(c) for c in report["calibration"]]
        out["calibration.svg"] = calibration_chart(docs, width=_PANEL[0], height=_PANEL[1]).encode()
    return out
