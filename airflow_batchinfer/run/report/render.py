"""The run report's markdown (``report/report.md``) from its summary, and the escaping that keeps
model output and record fields literal text in markdown (the report's and a review gate's)."""

from __future__ import annotations

import re
from typing import Any

from airflow_batchinfer.review.calibration import pooled
from airflow_batchinfer.run.report.usage_lines import usage_lines
from airflow_batchinfer.state.docs.calibration import Calibration
from airflow_batchinfer.state.docs.shard_status import RoundShards


def candidate_lines(rounds: list[dict[str, Any]]) -> list[str]:
    """The rounds whose records had several candidates (sampling ``n``): approval per candidate index
    and pass@k (the summary's ``candidates``)."""
    found = [(s["round"], c) for s in rounds if (c := s.get("candidates"))]
    if not found:
        return []
    n = max(c["n"] for _, c in found)
    ks = [k for k in range(1, n + 1) if k in (1, 2, 4, 8, 16, 32, 64, 128) or k == n]
    head = (
        "| round | n | records | approved by candidate (0, 1, …) | "
        + " | ".join(f"pass@{k}" for k in ks)
        + " |"
    )
    out = ["", "## Candidates", "", head, "|" + " --- |" * (4 + len(ks))]
    for r, c in found:
        passes = " | ".join(f"{c['pass_at'][str(k)]:.1%}" if str(k) in c["pass_at"] else "" for k in ks)
        by_index = ", ".join(map(str, c["approved_by_index"]))
        out.append(f"| {r} | {c['n']} | {c['records']} | {by_index} | {passes} |")
    return out


def adapter_lines(rounds: list[dict[str, Any]], reviews: list[dict[str, Any]] | None = None) -> list[str]:
    """Approval per LoRA adapter, per round whose records named adapters (the summary's ``adapters``).
    With spot checks, ``approved`` counts as the report's ``approved`` does: the rows approved at the
    close and the round's spot checks that no reviewer decided (they followed the judge into results
    at the gate's answer: ``reviews``, each round's applied decisions); ``spot checks``: those the
    judge approved and held for people; the approval is the judge's, spot checks among its approvals."""
    found = [(s["round"], name, a) for s in rounds for name, a in (s.get("adapters") or {}).items()]
    if not found:
        return []
    spots = any(a.get("spot_checks") for _, _, a in found)
    followed = {
        (v["round"], n): int(c)
        for v in reviews or []
        for n, c in (v.get("approved_by_adapter") or {}).items()
    }
    cols = ["round", "adapter", "approved", *(["spot checks"] if spots else []), "rejected", "approval"]
    out = ["", "## Adapters", "", "| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    for r, name, a in found:
        held = [a.get("spot_checks", 0)] if spots else []
        cells = [
            r,
            name,
            a["approved"] + followed.get((r, name), 0),
            *held,
            a["rejected"],
            f"{a['approval_rate']:.1%}",
        ]
        out.append("| " + " | ".join(map(str, cells)) + " |")
    if spots:
        out += [
            "",
            "Approved: at the round's close, and its spot checks no reviewer decided (approved as the judge "
            "said when the gate was answered). Spot checks: the judge's approvals held for people; the "
            "approval counts them as the judge's.",
        ]
    return out


def fan_out_line(report: dict[str, Any]) -> list[str]:
    f = report.get("fan_out")
    if not f:
        return []
    return [
        f"- fan-out: every input record once on each of {', '.join(f['arms'])}: {f['rows']} rows (ID@ARM)"
    ]


def jury_lines(rounds: list[dict[str, Any]]) -> list[str]:
    """A jury's rounds (the summary's ``jury``): how often its members disagreed, and each member's
    approval."""
    found = [(s["round"], j) for s in rounds if (j := s.get("jury"))]
    if not found:
        return []
    out = ["", "## Jury", "", "| round | voted | members split | member approval |", "|" + " --- |" * 4]
    for r, j in found:
        members = ", ".join(f"{name} {m['approval_rate']:.1%}" for name, m in j["members"].items())
        out.append(f"| {r} | {j['voted']} | {j['split']} ({j['disagreement_rate']:.1%}) | {members} |")
    return out


def unreadable_lines(invariant: dict[str, Any]) -> list[str]:
    """The records of quarantined shards that could not be read: no ids to account for, named."""
    out = []
    for u in invariant.get("unreadable") or []:
        count = "the records" if u.get("records") is None else f"{u['records']} records"
        groups = u.get("row_groups")
        where = f"row groups [{groups[0]}, {groups[1]})" if groups else f"bytes {u.get('range')}"
        out.append(
            f"  - unreadable, so without ids to account for: {count} of part `{u['part']}` ({where}), "
            f"quarantined shard {u['shard_id']}: {u['error']}"
        )
    return out


def truncated_cell(summary: dict[str, Any]) -> str:
    """A round's truncated rows, and those of them cut while thinking (no answer at all) apart."""
    cut, thinking = summary.get("truncated", 0), summary.get("truncated_in_thinking")
    return f"{cut} ({thinking} in thinking)" if thinking else f"{cut}"


def render_markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Batch inference report: {report['status']}",
        "",
        f"- run root: `{report['run_root']}`",
        f"- strategy: {report['strategy']}; stopped because: **{report['stop_reason']}**",
        f"- input: {report['input']}",
        *fan_out_line(report),
        f"- approved: {report['approved']}; "
        f"accepted by review: {report['accepted_by_review']}; dropped by review: "
        f"{report.get('dropped_by_review', 0)}; still pending: {report['remaining_pending']}; "
        f"exhausted in place: {report['exhausted_in_place']}",
        f"- quarantined shards: {len(report['failed_shards'])} (budget {report['max_failed_shards']})",
        f"- every input id accounted for exactly once: {report['invariant']['ok']}",
        *unreadable_lines(report["invariant"]),
        "",
        "| round | mode | pending | approved | rejected/exhausted | truncated | approval | failed shards "
        "| job s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in report["rounds"]:
        rate = "" if s.get("approval_rate") is None else f"{s['approval_rate']:.0%}"
        lines.append(
            f"| {s['round']} | {s['mode']} | {s['pending']} | {s['approved']} | "
            f"{s.get('rejected', s.get('exhausted', 0))} | {truncated_cell(s)} | {rate} | "
            f"{len(s['failed_shards'])} | "
            f"{s['job_seconds']} |"
        )
    lines += candidate_lines(report["rounds"])
    lines += adapter_lines(report["rounds"], report.get("reviews"))
    lines += jury_lines(report["rounds"])
    warnings = report.get("warnings") or []
    if warnings:  # what the pre-flight warns of in the settings (preflight.retry_warnings)
        lines += ["", "## Pre-flight warnings", "", *(f"- {w}" for w in warnings)]
    by_lanes = [RoundShards.model_validate(rs) for rs in report.get("shard_status") or []]
    if by_lanes:
        lines += ["", "## Shards by lane"]
        for rs in by_lanes:
            lines += ["", *shard_lines(rs)]
    if report["failed_shards"]:
        # the lane that ran each (a round run by lanes), as "Shards by lane" lists them
        lane_of = {(rs.round, f.shard_id): f.lane for rs in by_lanes for f in rs.failed}
        lines += ["", "## Quarantined shards", ""]
        for f in report["failed_shards"]:
            lane = lane_of.get((f["round"], f["shard_id"]))
            by = "" if lane is None else f", lane {lane}"
            lines.append(f"- round {f['round']} `{f['shard_id']}` ({f['phase']}{by}): {f['error']}")
    if report.get("reviews"):
        head = "| round reviewed | decisions | accepted | retried | dropped |"
        lines += ["", "## Review decisions", "", head, "| --- | --- | --- | --- | --- |"]
        lines += [
            f"| {v['round']} | {v['decisions']} | {v['counts']['accept']} | {v['counts']['retry']} | "
            f"{v['counts']['drop']} |"
            for v in report["reviews"]
        ]
        followed = sum(int(v["counts"].get("approve", 0)) for v in report["reviews"])
        if followed:
            lines += ["", f"Spot checks no reviewer decided, approved as the judge said: {followed}."]
    lines += calibration_lines(report.get("calibration") or [])
    lines += ["", "## Workers", "", "| worker | jobs | avg batch fill | engine busy s | tokens |"]
    lines += ["| --- | --- | --- | --- | --- |"]
    lines += [
        f"| {n} | {w['jobs']} | {w['avg_fill']} | {w['engine_busy_s']} | {w['tokens']} |"
        for n, w in report["workers"].items()
    ]
    lines += engine_lines(report.get("engine") or [])
    lines += usage_lines(report.get("usage"))
    lines += [
        "",
        "Plots: `rounds.svg` (approval and pending per round), `workers.svg` (batch fill, busy time)"
        + (", `calibration.svg` (the judge against the reviewers)." if report.get("calibration") else "."),
    ]
    return "\n".join(lines) + "\n"


def engine_lines(rounds: list[dict[str, Any]]) -> list[str]:
    """report.md's **Engine** table: a row per round with engine figures (``–``: not reported)."""
    if not rounds:
        return []
    lines = [
        "",
        "## Engine",
        "",
        "Per round, over its jobs; rates per engine-second (one worker's, on average).",
        "",
        "| round | jobs | engines | generated tokens | generated tok/s | prompt tok/s | prefix-cache hits "
        "| preemptions | KV cache peak / mean | running peak | waiting peak |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for e in rounds:
        c, g = e["counters"], e["gauges"]
        kv = g.get("kv_cache_usage") or {}
        cells = [
            e["round"],
            e["jobs"],
            e["engines"],
            _shown(c.get("generation_tokens")),
            _shown(e.get("generation_tokens_per_s")),
            _shown(e.get("prompt_tokens_per_s")),
            _shown(e["prefix_cache_hit_rate"], "{:.1%}"),
            _shown(c.get("preemptions")),
            f"{_shown(kv.get('peak'), '{:.1%}')} / {_shown(kv.get('mean'), '{:.1%}')}",
            _shown((g.get("running") or {}).get("peak"), "{:g}"),
            _shown((g.get("waiting") or {}).get("peak"), "{:g}"),
        ]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return lines


def _shown(value: Any, fmt: str = "{}") -> str:
    return "–" if value is None else fmt.format(value)


MAX_LANE_ROWS = 16  # lanes a round's table lists in full; more: a summary line and the slowest
SLOWEST = 10  # the slowest lanes listed past MAX_LANE_ROWS
MAX_FAILED_LINES = 20  # failed shards a round lists in report.md (all are in summary.json's lists)


def shard_summary(rs: RoundShards) -> str:
    """One line of a round's shards: how many, by how many lanes, by state (the report operator
    logs it too)."""
    c = rs.counts
    return (
        f"round {rs.round} ({rs.slot}): {rs.shards} shards ({rs.records} records) by {rs.lanes} lanes: "
        f"{c['done']} done, {c['failed']} failed, {c['unfinished']} unfinished, "
        f"{c['unclaimed']} never claimed; {rs.busy_s:.1f} lane-seconds busy"
    )


def shard_lines(rs: RoundShards) -> list[str]:
    """A round's shards in report.md: the counts, a table of its lanes (past
    :data:`MAX_LANE_ROWS` lanes: how shards and busy time spread over them, and the
    :data:`SLOWEST` busiest), and its failed shards with their lane, error and quarantine record."""
    lines = [f"### Round {rs.round}", "", f"- {shard_summary(rs)}"]
    lanes = rs.lane_figures
    if len(lanes) > MAX_LANE_ROWS:
        spread = rs.spread()
        shards, busy = spread["shards"], spread["busy_s"]
        lines.append(
            f"- {len(lanes)} lanes: shards per lane {shards[0]:g} to {shards[2]:g} (median {shards[1]:g}); "
            f"busy s per lane {busy[0]:.1f} to {busy[2]:.1f} (median {busy[1]:.1f}); "
            f"{sum(1 for f in lanes if not f.finished)} not finished. The {SLOWEST} busiest:"
        )
        lanes = sorted(lanes, key=lambda f: (-f.busy_s, f.lane))[:SLOWEST]
    lines += [
        "",
        "| lane | shards | done | failed | unfinished | records | busy s | finished |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {f.lane} | {f.shards} | {f.done} | {f.failed} | {f.unfinished} | {f.records} | "
        f"{f.busy_s:.1f} | {'yes' if f.finished else 'no'} |"
        for f in lanes
    ]
    if rs.failed_count:
        lines += ["", f"Failed shards of round {rs.round} ({rs.failed_count}):", ""]
        for f in rs.failed[:MAX_FAILED_LINES]:
            lane = "never claimed" if f.lane is None else f"lane {f.lane}"
            where = f"quarantine record `{f.quarantine}`" if f.quarantine else "not quarantined yet"
            lines.append(f"- `{f.shard_id}` ({lane}; {where}): {_one_line(f.error)}")
        if rs.failed_count > MAX_FAILED_LINES:
            lines.append(
                f"- … and {rs.failed_count - MAX_FAILED_LINES} more: `summary.json` lists "
                f"{len(rs.failed)}, `round-{rs.round:02d}/failed/` holds every quarantine record"
            )
    if rs.unfinished:
        more = f" (first {len(rs.unfinished)})" if len(rs.unfinished) < rs.counts["unfinished"] else ""
        lines += ["", f"Unfinished shards{more}: " + ", ".join(f"`{s}`" for s in rs.unfinished)]
    return lines


def _one_line(text: str | None, width: int = 300) -> str:
    """An error in a markdown list item: one line, cut to ``width`` characters."""
    flat = " ".join((text or "no error recorded").split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def kappa(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def calibration_lines(found: list[dict[str, Any]]) -> list[str]:
    """report.md's **Judge and reviewers**: per reviewed round the judge's agreement with the people,
    Cohen's kappa, precision and recall of "approve" (the person as truth), and per score bucket (the
    rounds pooled) the judge's approval, the people's and their agreement."""
    if not found:
        return []
    docs = [Calibration.model_validate(c) for c in found]
    lines = [
        "",
        "## Judge and reviewers",
        "",
        "Each reviewed row weighed by the judged rows of its stratum (the judge's verdict and score "
        "bucket) it stands for; decisions by filter not counted. `calibration.svg` plots both tables.",
        "",
        "| round | reviewed | spot checks | agreement | kappa | precision | recall | coverage | notes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for d in docs:
        notes = cell("; ".join(d.notes), 200)
        lines.append(
            f"| {d.round} | {d.reviewed} | {d.spot_checks} | {pct(d.agreement)} | {kappa(d.kappa)} | "
            f"{pct(d.precision)} | {pct(d.recall)} | {pct(d.coverage)} | {notes} |"
        )
    buckets = pooled(docs)
    if buckets:
        lines += [
            "",
            "Per judge score bucket (choosing `review_below_score`: below the buckets whose agreement "
            "you trust, people decide):",
            "",
            "| score from | judged rows | judge approval | reviewed | reviewers' approval | agreement |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| {b.bucket} | {b.rows if b.rows else '–'} | {pct(b.judge_approval)} | {b.reviewed} | "
            f"{pct(b.person_approval)} | {pct(b.agreement)} |"
            for b in buckets
        ]
    return lines


# Every ASCII punctuation character may be backslash-escaped in CommonMark, and then means itself.
_MARKUP = re.compile(r"""([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~])""")
_ESCAPED = re.compile(r"\\" + _MARKUP.pattern)  # what _MARKUP escaped, for plain_text


# GitHub-flavoured markdown (the UI's) links bare URLs, www. names and e-mail addresses even when
# escaped: a word joiner (U+2060, invisible) after "://", "www" and "@" keeps them text.
_AUTOLINK = re.compile(r"(://|\bwww(?=\.)|@)", re.IGNORECASE)


def plain_text(markdown: str) -> str:
    """A gate body for a terminal: the escapes that keep its values literal in the UI removed
    (``\\.`` becomes ``.``, the word joiners go)."""
    return _ESCAPED.sub(r"\1", markdown).replace("\u2060", "")


def cell(value: Any, width: int = 80) -> str:
    """Model output and record fields as literal text in a markdown table cell: never HTML, an
    image, a link or emphasis (the review page renders the body as markdown)."""
    raw = str("" if value is None else value)
    head = raw[: width * 8]  # whitespace runs fold to one space: enough to fill the cell, not MiBs
    text = " ".join(head.split())
    if len(text) > width or len(head) < len(raw):
        text = text[: width - 1] + "…"
    return _MARKUP.sub(r"\\\1", _AUTOLINK.sub("\\1\u2060", text))
