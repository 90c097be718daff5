"""The markdown a reviewer sees on a review gate's Required Actions page (bounded whatever the rows
hold), and the links to a DAG run's pages in the Airflow UI and on the review desk."""

from __future__ import annotations

import urllib.parse
from typing import Any

from airflow_batchinfer.run.plan import (
    NOTHING_PENDING,
    Proposal,
    pending_shards,
)
from airflow_batchinfer.run.report.render import cell, kappa, pct
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import (
    Summary,
    read_summary,
)
from airflow_batchinfer.state.docs.calibration import read_calibration
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlFile
from airflow_batchinfer.storage.location import StorageOptions


def review_body(
    cfg: RunConfig,
    proposal: Proposal,
    so: StorageOptions | None = None,
    sample: int = 10,
    *,
    desk: str | None = None,
    gpus: str | None = None,
) -> str:
    """The markdown a reviewer sees on the Required Actions page before round slot ``proposal.plan``;
    ``desk`` is the URL of this gate on the review desk (:func:`desk_url`); ``gpus`` what happens to
    the run's GPUs while the gate waits (:func:`~airflow_batchinfer.run.gate.idle.gate_idle`'s text).
    Bounded whatever the rows hold: each text in it is cut (a cell to 80 characters, a reason of the
    controller's to :data:`MAX_BODY_TEXT`), and the whole to :data:`MAX_BODY_BYTES` (:func:`_fit`)."""
    layout = RunLayout(cfg.run_root)
    plan = proposal.plan
    history = [s for r in range(plan.round) if (s := read_summary(layout, r, so))]
    last = proposal.last
    lines = [
        f"**Run** {cell(cfg.run_root, 2000)} · strategy **{_cut(cfg.retries.strategy)}** · "
        f"next: **{plan.slot}**",
        "",
        *(
            [
                f"**[Review every sample on the review desk]({desk})**: accept, retry or drop them "
                "one by one or by filter before you answer.",
                "",
            ]
            if desk
            else []
        ),
        f"Round {last.round if last else '?'} approved **{last.approved if last else 0}** of "
        f"{last.pending if last else 0} ({((last.approval_rate if last else None) or 0):.0%}); "
        f"**{plan.records or (last.next_pending if last else None) or 0}** records "
        f"are pending; {len(last.failed_shards) if last else 0} shards quarantined.",
        "",
        f"The controller proposes: **{'stop' if plan.stop else plan.mode}** "
        f"({_cut(plan.stop) + ': ' if plan.stop else ''}{_cut(plan.reason)}).",
        "",
        "| round | pending | approved | approval |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| {s.round} | {s.pending} | {s.approved} | {(s.approval_rate or 0):.0%} |" for s in history]
    lines += _gate_calibration(layout, plan.round, last, so)
    pending = plan.shards or (pending_shards(layout, plan.round, so) if plan.stop != NOTHING_PENDING else [])
    table = _sample_rows(pending, cfg.data.id_field or "id", sample, so)  # cut as each row is read
    lines += [
        "",
        f"**Rejected samples** (first {len(table)}):",
        "",
        "| id | prompt | output | judge's reason |",
    ]
    lines += ["| --- | --- | --- | --- |", *table]
    tail = [
        *(["", _cut(gpus)] if gpus else []),
        "",
        f"Full rejected set: {cell(layout.pending(plan.round), 2000)}",
        "",
        "**Continue**: another round on the pending set. **Continue in place**: retry each pending sample "
        "inside the workers until approved or max_attempts. **Accept remaining as they are**: copy them "
        "into results, marked `accepted_by_review`. **Stop**: end the run; the pending set stays reported.",
    ]
    return _fit(lines, tail)


def _gate_calibration(
    layout: RunLayout, r: int, last: Summary | None, so: StorageOptions | None
) -> list[str]:
    """A gate's lines on checking the judge: the spot checks of the round under review, and the
    judge's calibration against the reviewers of each earlier round (this round's is live on the
    desk until the answer applies its decisions)."""
    out = []
    if last is not None and last.spot_checks:
        out += [
            "",
            f"**{last.spot_checks} rows the judge approved are held for a spot check** (reason group "
            "*spot check* on the desk): accept the ones you agree with, retry or drop the others; one "
            "nobody decides goes to results as the judge said.",
        ]
    earlier = [c for q in range(max(r - 1, 0)) if (c := read_calibration(layout, q, so))]
    if earlier:
        out += [
            "",
            "**The judge against the reviewers** (earlier rounds; this round's are live on the desk):",
            "",
            "| round | reviewed | agreement | kappa | precision | recall |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        out += [
            f"| {c.round} | {c.reviewed} | {pct(c.agreement)} | {kappa(c.kappa)} | {pct(c.precision)} | "
            f"{pct(c.recall)} |"
            for c in earlier
        ]
    return out


MAX_BODY_BYTES = 64 * 1024  # a gate's body at most (UTF-8): Airflow stores it and its UI renders it
MAX_BODY_TEXT = 1_000  # characters of one text of the controller's in it (a reason, a stop)


def _sample_rows(pending: list[Any], id_field: str, sample: int, so: StorageOptions | None) -> list[str]:
    """The first ``sample`` pending rows as table lines, each row's cells cut as it is read (no row
    is kept: a row may be many MiB)."""
    out: list[str] = []
    for shard in pending:
        if len(out) >= sample:
            break
        for row in JsonlFile(shard.uri, storage_options=so).iter_records():
            prompt = row.get("prompt", row.get("question", ""))
            judgment = row.get("judgment") or {}
            out.append(
                f"| {cell(row.get(id_field))} | {cell(prompt)} | {cell(row.get('result'))} | "
                f"{cell(judgment.get('reason') or row.get('status'))} |"
            )
            if len(out) >= sample:
                break
    return out


def _fit(lines: list[str], tail: list[str], limit: int = MAX_BODY_BYTES) -> str:
    """``lines`` then ``tail`` (the answers' meaning: always kept) in ``limit`` UTF-8 bytes: the lines
    past it are left out, and a note says how many and where to read everything."""
    ending = "\n".join(tail)
    budget = limit - len(ending.encode()) - 400  # room for the note
    kept: list[str] = []
    used = 0
    for k, line in enumerate(lines):
        used += len(line.encode()) + 1
        if used > budget:
            note = (
                f"*(truncated: {len(lines) - k} more lines left out to keep this text under "
                f"{limit // 1024} KiB; the review desk and the run root hold every sample)*"
            )
            kept += ["", note]
            break
        kept.append(line)
    return "\n".join([*kept, ending])


def _cut(value: Any, limit: int = MAX_BODY_TEXT) -> str:
    """A text of ours in the body (not escaped: it is markdown), cut to ``limit`` characters."""
    text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def run_url(base_url: str, dag_id: str, run_id: str, page: str = "") -> str:
    """A DAG run's page in the Airflow UI (``page``: a tab below it, e.g. ``required_actions``), the
    ids percent-encoded: safe to paste and as a markdown link target whatever they hold."""
    dag, run = (urllib.parse.quote(p, safe="") for p in (dag_id, run_id))
    return f"{base_url.rstrip('/')}/dags/{dag}/runs/{run}" + (f"/{page}" if page else "")


def desk_url(base_url: str, dag_id: str, run_id: str) -> str:
    """A DAG run's tab on the review desk (the plugin's ``review-desk`` view)."""
    return run_url(base_url, dag_id, run_id, "plugin/review-desk")
