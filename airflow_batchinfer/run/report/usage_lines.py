"""report.md's **GPU usage** section: the run's GPU-seconds (the report's ``usage``,
:class:`~airflow_batchinfer.state.docs.usage_account.UsageAccount`) — leased, busy, idle at gates
and in tails, what ``keep`` would have cost — with a row per round and per gate, and each pool
start's marks (scheduled → started → model loaded → ready)."""

from __future__ import annotations

from typing import Any


def _h(gpu_s: float | None) -> str:
    """GPU-seconds, with GPU-hours beside them once they are many."""
    if gpu_s is None:
        return "–"
    return f"{gpu_s:,.0f} ({gpu_s / 3600:,.2f} GPU-h)" if gpu_s >= 3600 else f"{gpu_s:,.1f}"


def _mark(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def usage_lines(usage: dict[str, Any] | None) -> list[str]:
    """The section, or a line saying why the figures are not known (never zeros in their place)."""
    if usage is None:
        return []
    lines = ["", "## GPU usage", ""]
    if not usage["known"]:
        return [*lines, f"Not known: {usage['note']}."]
    lines += [
        f"- GPU-seconds leased: {_h(usage['leased_gpu_s'])}; busy: {_h(usage['busy_gpu_s'])}",
        f"- idle at review gates: {_h(usage['idle_gates_gpu_s'])}; in round tails: "
        f"{_h(usage['idle_tails_gpu_s'])}; otherwise (setup, warm-ups, between rounds): "
        f"{_h(usage['idle_other_gpu_s'])}",
        f"- with `gate_idle: keep` the run would have leased {_h(usage['keep_gpu_s'])} "
        f"(saved: {_h(usage['saved_gpu_s'])}); re-warms took {usage['rewarm_s']:.1f} s",
        *([f"- {usage['note']}"] if usage["note"] else []),
    ]
    if usage["rounds"]:
        lines += ["", "| round | span s | leased GPU-s | busy GPU-s | busy | tail idle GPU-s |"]
        lines += ["| --- | --- | --- | --- | --- | --- |"]
        for r in usage["rounds"]:
            busy = "–" if r["busy_fraction"] is None else f"{r['busy_fraction']:.0%}"
            lines.append(
                f"| {r['round']} | {r['ended_at'] - r['started_at']:.1f} | {r['leased_gpu_s']:.1f} | "
                f"{r['busy_gpu_s']:.1f} | {busy} | {r['idle_tail_gpu_s']:.1f} |"
            )
    if usage["gates"]:
        lines += [
            "",
            "| gate | policy | wait s | leased GPU-s | keep would lease |",
            "| --- | --- | --- | --- | --- |",
        ]
        for g in usage["gates"]:
            wait = f"{g['wait_s']:.1f}" + ("" if g["answered_at"] is not None else " (waiting)")
            lines.append(
                f"| {g['slot'] or '–'} | {g['policy'] or '–'} | {wait} | {g['leased_gpu_s']:.1f} | "
                f"{g['keep_gpu_s']:.1f} |"
            )
    if usage["warms"]:
        lines += [
            "",
            "Pool starts (seconds from the request: scheduled → started → model loaded → ready):",
            "",
        ]
        for w in usage["warms"]:
            lines.append(f"- {w['pool']} ({w['slot'] or 'setup'}): ready after {w['seconds']:.1f} s")
            lines += [
                f"  - {s['worker']}: {_mark(s['scheduled_s'])} → {_mark(s['started_s'])} → "
                f"{_mark(s['loaded_s'])} → {_mark(s['ready_s'])}"
                for s in w["workers"]
            ]
    return lines
