"""The run report: ``report/summary.json``, ``report/report.md`` and SVG plots, from the files the
rounds left in storage (plans, summaries, job manifests, lane documents), plus the whole-run id
check. A round run by lanes (one Airflow task per lane, not per shard) reports each of its shards'
states and each lane's figures (``shard_status``:
:class:`~airflow_batchinfer.state.docs.shard_status.RoundShards`)."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from airflow_batchinfer import charts
from airflow_batchinfer.engines.stats import CounterName
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.review.calibration import calibration_chart, pooled
from airflow_batchinfer.run.close import MAX_NAMED, WORKER_FIELDS
from airflow_batchinfer.run.jobs import round_kinds
from airflow_batchinfer.run.plan import (
    ACCEPTED_BY_REVIEW,
    IN_PLACE_DONE,
    MAX_ROUNDS,
    NOTHING_PENDING,
    STOPPED_BY_REVIEW,
    Proposal,
    pending_shards,
)
from airflow_batchinfer.run.preflight import retry_warnings
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import (
    AcceptedJob,
    EngineTelemetry,
    FailedShard,
    Plan,
    Summary,
    read_accepted,
    read_doc,
    read_plan,
    read_summary,
    review_applied,
    slots,
    write_doc,
)
from airflow_batchinfer.state.docs.calibration import Calibration, read_calibration
from airflow_batchinfer.state.docs.shard_status import RoundShards, round_status
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlDir, JsonlFile, ShardDescriptor, files
from airflow_batchinfer.storage.digest import IdDigest, diff_ids, file_ids, total
from airflow_batchinfer.storage.id_hashes import REJECTS_SUFFIX
from airflow_batchinfer.storage.json_doc import write_bytes
from airflow_batchinfer.storage.location import StorageOptions, join, resolve
from airflow_batchinfer.storage.manifest import read_manifest
from airflow_batchinfer.storage.ranges import range_ids

# A run some of whose round slots never planned or closed (an upstream task failed).
INCOMPLETE = "incomplete"
# How a run ended, from its stop reason; only "complete" is a normal completion.
STATUS = {
    NOTHING_PENDING: "complete",
    IN_PLACE_DONE: "complete",
    MAX_ROUNDS: "exhausted",
    ACCEPTED_BY_REVIEW: "accepted_by_review",
    STOPPED_BY_REVIEW: "stopped_by_review",
}


def build_report(cfg: RunConfig, so: StorageOptions | None = None) -> dict[str, Any]:
    layout = RunLayout(cfg.run_root)
    plans = [p for s in slots(cfg.max_rounds) if (p := read_plan(layout, s, so))]
    ran = [p for p in plans if p.mode != "skip"]
    summaries = {p.slot: read_summary(layout, p.round, so) for p in ran}
    rounds = [s for s in summaries.values() if s]
    stop = next((p.stop for p in plans if p.stop), None)
    in_place_ran = any(p.mode == "in_place" for p in ran)
    stop = stop or (IN_PLACE_DONE if in_place_ran else NOTHING_PENDING)
    status = STATUS[stop]
    # Every slot plans (a skip too) and every round that ran closes: a run where one did not (an
    # upstream task failed: the shard task, the pool setup, a plan or a close) has not finished.
    unplanned = [s for s in slots(cfg.max_rounds) if s not in {p.slot for p in plans}]
    unclosed = [slot for slot, s in summaries.items() if s is None]
    reason = stop
    if unplanned or unclosed:
        status = INCOMPLETE
        missing = ", ".join([*unplanned, *unclosed])
        reason = f"the run did not finish: {missing} " + (
            "not planned" if unplanned and not unclosed else "not planned or not closed"
        )
    exhausted = sum(s.exhausted or 0 for s in rounds)
    if status == "complete" and exhausted:
        status = "exhausted"  # samples that used up max_attempts in place are not a normal completion
    failed = [f for s in rounds for f in s.failed_shards]
    # What is still pending: the set the last round left, unless in place or acceptance took it.
    r_next = sum(1 for p in ran if p.mode == "rounds")
    final_pending = [] if in_place_ran or stop == ACCEPTED_BY_REVIEW else _pending(layout, r_next, status, so)
    id_field = cfg.id_field or "id"
    invariant = check_invariant(layout, id_field, final_pending, rounds, failed, so, plans=plans)
    if failed and len(failed) > cfg.max_failed_shards and status != INCOMPLETE:
        status = "failed_shards"
    reviews = _reviews(layout, plans, so)
    shard_status = shard_figures(layout, ran, summaries, so)
    report = {
        "run_root": cfg.run_root,
        "strategy": cfg.strategy,
        "status": status,
        "stop_reason": reason,
        "input": (read_manifest(JsonlDir(layout.input, storage_options=so)) or {}).get("counts"),
        "fan_out": fan_out_figures(cfg, layout, so),
        "rounds": [s.to_json() for s in rounds],
        # What each slot decided; the settings its round ran (templates, judge) stay in its plan.json.
        "plans": [
            {k: v for k, v in vars(p).items() if k != "config"} | {"shards": len(p.shards)} for p in plans
        ],
        # the judge's approvals: into results at each close, and spot checks no person decided after it
        "approved": sum(s.approved for s in rounds)
        + sum(int(a.get("counts", {}).get("approve", 0)) for a in reviews),
        "accepted_by_review": (_count_rows(layout, "accepted-", so) if stop == ACCEPTED_BY_REVIEW else 0)
        + sum(int(a["accepted"]["count"]) for a in reviews),
        "dropped_by_review": sum(int(a["dropped"]["count"]) for a in reviews),
        "reviews": reviews,  # the reviewers' decisions per reviewed round, as they took effect
        # the judge against the reviewers, per reviewed round (round-NN/review/calibration.json)
        "calibration": [c.to_json() for c in calibrations(layout, plans, so)],
        "remaining_pending": sum(s["records"] for s in final_pending),
        # where it is: what a review's decisions left pending, or the round's pending set
        "remaining_pending_uri": _pending_uri(layout, r_next, so) if final_pending else None,
        "exhausted_in_place": exhausted,
        "failed_shards": [f.to_json() for f in failed],
        "max_failed_shards": cfg.max_failed_shards,
        # per round run by lanes: its shards by state, per lane, the failed ones (none: before lanes)
        "shard_status": [f.to_json() for f in shard_status],
        "preflight": read_doc(join(layout.preflight, "summary.json"), "preflight summary", so),
        # what the settings alone warn of: also with the pre-flight's sample off, and for the CLI's runs
        "warnings": retry_warnings(cfg),
        "workers": _per_worker(rounds),
        "engine": engine_rounds(cfg, layout, [p for p in ran if summaries.get(p.slot)], so),
        "invariant": invariant,
    }
    write_doc(join(layout.report, "summary.json"), report, so)
    write_bytes(resolve(join(layout.report, "report.md"), so), render_markdown(report).encode())
    for name, svg in plots(report).items():
        write_bytes(resolve(join(layout.report, name), so), svg)
    return report


def shard_figures(
    layout: RunLayout, ran: list[Plan], summaries: dict[str, Summary | None], so: StorageOptions | None
) -> list[RoundShards]:
    """The shard figures of each round that ``ran`` by lanes (a round run one task per shard, before
    lanes, has none); a closed round's quarantine records come from its summary."""
    out = []
    for plan in ran:
        summary = summaries.get(plan.slot)
        failed = None if summary is None else summary.failed_shards
        status = round_status(layout, plan, so, failed=failed)
        if status.tracked:
            out.append(status.figures())
    return out


def _pending_uri(layout: RunLayout, r: int, so: StorageOptions | None) -> str:
    return layout.reviewed(r) if review_applied(layout, r, so) else layout.pending(r)


def _pending(layout: RunLayout, r: int, status: str, so: StorageOptions | None) -> list[ShardDescriptor]:
    """What the run leaves pending; of an incomplete run, what is known (its invariant then fails)."""
    try:
        return pending_shards(layout, r, so)
    except ConfigError:
        if status != INCOMPLETE:
            raise
        return []


def _count_rows(layout: RunLayout, prefix: str, so: StorageOptions | None) -> int:
    files = JsonlDir(layout.results, storage_options=so).jsonl_files()
    return sum(1 for f in files if f.uri.rsplit("/", 1)[-1].startswith(prefix) for _ in f.iter_records())


def _per_worker(rounds: list[Summary]) -> dict[str, Any]:
    """Batch fullness and engine busy time per worker, summed over the rounds' summaries."""
    total: dict[str, dict[str, float]] = {}
    for summary in rounds:
        for name, w in summary.workers.items():
            acc = total.setdefault(name, dict.fromkeys(WORKER_FIELDS, 0.0))
            for key in WORKER_FIELDS:
                acc[key] += getattr(w, key)
    return {
        name: {
            "jobs": int(w["jobs"]),
            "avg_fill": round(w["fill_sum"] / w["jobs"], 3) if w["jobs"] else 0.0,
            "engine_busy_s": round(w["engine_busy_s"], 3),
            "job_seconds": round(w["job_seconds"], 3),
            "tokens": int(w["tokens"]),
        }
        for name, w in total.items()
    }


def engine_rounds(
    cfg: RunConfig, layout: RunLayout, closed: list[Plan], so: StorageOptions | None
) -> list[dict[str, Any]]:
    """Per closed round, its engines' figures over the jobs close accepted (their manifests'
    ``engine_stats``, copied into the accepted docs; :func:`round_engine`). A round none of whose
    jobs has any (engines without stats, or jobs from before them) is left out."""
    out = []
    for plan in closed:
        kinds = round_kinds(plan.effective_config(cfg), plan.mode)
        uris = [layout.accepted(plan.round, s["shard_id"], kind) for s in plan.shards for kind in kinds]
        with ThreadPoolExecutor(8) as ex:
            docs = list(ex.map(lambda uri: read_accepted(uri, so), uris))
        jobs = [d.engine_stats for d in docs if isinstance(d, AcceptedJob) and d.engine_stats is not None]
        if jobs:
            out.append({"round": plan.round, "slot": plan.slot, **round_engine(jobs)})
    return out


def round_engine(jobs: list[EngineTelemetry]) -> dict[str, Any]:
    """The engine figures of a round's jobs. Jobs that ran at once on one engine share its work: per
    engine their windows are merged where they overlap, and a merged window's counters are the
    engine's count at its end less that at its start, never the jobs' deltas added up. Rates are per
    engine-second (the time its engines had jobs): a worker's rate on average. Gauges: the highest
    peak, and the jobs' means weighted by their length."""
    counters: dict[str, int] = {}
    seconds = 0.0
    by_engine: dict[str, list[EngineTelemetry]] = {}
    for job in jobs:
        by_engine.setdefault(job.engine_id, []).append(job)
    for windows in by_engine.values():
        for span_s, grown in _merged(windows):
            seconds += span_s
            for k, v in grown.items():
                counters[k] = counters.get(k, 0) + v
    gauges: dict[str, dict[str, float]] = {}
    for name in sorted({g for job in jobs for g in job.gauges}):
        spans = [(job.gauges[name], max(job.seconds, 1e-3)) for job in jobs if name in job.gauges]
        weight = sum(w for _, w in spans)
        gauges[name] = {
            "peak": max(g.peak for g, _ in spans),
            "mean": round(sum(g.mean * w for g, w in spans) / weight, 4),
        }
    queries = counters.get("prefix_cache_queries")
    hit_rate = round(counters.get("prefix_cache_hits", 0) / queries, 4) if queries else None
    return {
        "jobs": len(jobs),
        "engines": len(by_engine),
        "engine_seconds": round(seconds, 3),
        "counters": counters,
        **{
            f"{k}_per_s": round(counters[k] / seconds, 2) if seconds else None
            for k in ("generation_tokens", "prompt_tokens")
            if k in counters
        },
        "prefix_cache_hit_rate": hit_rate,
        "gauges": gauges,
    }


def _merged(windows: list[EngineTelemetry]) -> Iterator[tuple[float, dict[CounterName, int]]]:
    """One engine's job windows merged where they overlap: each merged window's length and how much
    each counter grew in it (its latest end less its earliest start: the counters only grow)."""
    spans = sorted(windows, key=lambda w: w.started_at)
    k = 0
    while k < len(spans):
        first = spans[k]
        end = first.started_at + first.seconds
        group = [first]
        k += 1
        while k < len(spans) and spans[k].started_at <= end:
            end = max(end, spans[k].started_at + spans[k].seconds)
            group.append(spans[k])
            k += 1
        names = set.intersection(*(set(w.at_start) & set(w.counters) for w in group))
        grown = {n: max(w.at_start[n] + w.counters[n] for w in group) - first.at_start[n] for n in names}
        yield end - first.started_at, grown


def check_invariant(
    layout: RunLayout,
    id_field: str,
    pending: list[Any],
    rounds: list[Summary],
    failed: list[FailedShard],
    so: StorageOptions | None = None,
    *,
    plans: list[Plan] | None = None,
) -> dict[str, Any]:
    """Every input id is in exactly one of: results (approved or accepted), the final pending set,
    an in-place round's exhausted rows, or (by shard) a quarantined job; a later occurrence of an id
    in another of round 0's byte ranges is in ``rejects/`` instead (the input's digests count lines:
    such an id twice, in results or pending once and in rejects once).

    Checked from digests, in O(shards) and holding no id in memory: the input's shard digests
    (``input/_manifest.json``) must equal the sum of every round's approved, exhausted and
    quarantined digests (``summary.json``), the final pending set's shard digests and what a review
    accepted (its plan). Each round's close checked its own shards and named the ids it found lost or
    doubled; the report repeats them. Only a run whose documents lack digests (started before they
    existed), or whose digests disagree with no round naming why, is checked by reading its ids, in
    bounded memory (:func:`~airflow_batchinfer.storage.digest.diff_ids`); round 0's range shards
    (:mod:`~airflow_batchinfer.storage.ranges`), a quarantined one's included, are then read by
    their ranges, never the whole source. ``lost``, ``doubled`` and ``unexpected`` name at most 20
    ids each; ``checked`` says how (``digests`` or ``ids``)."""
    manifest = read_manifest(JsonlDir(layout.input, storage_options=so)) or {}
    expected = total(IdDigest.maybe(s.get("ids")) for s in manifest.get("shards", []))
    parts: list[IdDigest | None] = [IdDigest.maybe(s.get("ids")) for s in pending]
    for x in rounds:
        names = ("approved", "failed") + (("exhausted",) if x.mode == "in_place" else ())
        # round 0's repeats, rejected: lines read
        names += ("repeated",) if "repeated" in (x.ids or {}) else ()
        parts += [x.digest(name) for name in names]
    parts += _accepted_ids(layout, plans, so)
    accounted = total(parts)
    named = {k: _named(getattr(x.invariant, k) for x in rounds) for k in ("lost", "doubled", "unexpected")}
    if expected is not None and accounted is not None and (expected == accounted or any(named.values())):
        return {
            "input": expected.count,
            "accounted": accounted.count,
            **named,
            "ok": expected == accounted and not any(named.values()),
            "checked": "digests",
        }
    # No digests to go by, or digests that disagree with no round naming why: read the ids.
    input_dir = JsonlDir(layout.input, storage_options=so)
    ranges = {s["shard_id"]: s for s in manifest.get("shards", []) if "range" in s}
    reads = _RangeIds(manifest, id_field, so)
    seen: list[JsonlFile | ShardDescriptor] = list(JsonlDir(layout.results, storage_options=so).jsonl_files())
    seen += [s if "range" in s else JsonlFile(s["uri"], storage_options=so) for s in pending]
    seen += JsonlDir(layout.dropped, storage_options=so).jsonl_files()  # what reviewers dropped
    # round 0's repeats rejected into rejects/ (each row has its id)
    rejects = JsonlDir(layout.rejects, storage_options=so).jsonl_files()
    seen += [f for f in rejects if f.uri.endswith(REJECTS_SUFFIX)]
    for x in rounds:
        if x.mode == "in_place":
            seen += JsonlDir(layout.rejected_dir(x.round), storage_options=so).jsonl_files()
    for f in failed:  # a failed job: its whole input shard (round 0's: the range it was to read)
        shard = ranges.get(f.shard_id) if f.round == 0 else None
        seen.append(shard or JsonlFile(f.uri, storage_options=so))
    # Range shards of the source leave nothing under input/ but the manifest.
    inputs: list[JsonlFile | ShardDescriptor] = (
        list(manifest["shards"]) if ranges else [input_dir.file(s.name) for s in input_dir.shards()]
    )
    diff = diff_ids(lambda: reads.ids(inputs), lambda: reads.ids(seen), limit=MAX_NAMED)
    return {
        "input": diff.expected.count,
        "accounted": diff.actual.count,
        "lost": diff.lost,
        "doubled": diff.doubled,
        "unexpected": diff.unexpected,
        "ok": diff.ok,
        "checked": "ids",
    }


class _RangeIds:
    """The ids of files and of round-0 range shards, one at a time (a side of :func:`diff_ids`). A
    range is read by its range only, validated as its job read it (bad lines dropped, ids assigned
    as the run assigned them), never the whole source."""

    def __init__(self, manifest: dict[str, Any], id_field: str, so: StorageOptions | None) -> None:
        self.id_field = id_field
        self.range_id_field = manifest.get("id_field") or id_field  # what round 0's jobs used
        self.assign_ids = bool((manifest.get("fingerprint") or {}).get("assign_ids"))
        self.so = so

    def ids(self, sources: Iterable[JsonlFile | ShardDescriptor]) -> Iterator[Any]:
        for src in sources:
            if isinstance(src, JsonlFile):
                yield from file_ids([src], self.id_field)
                continue
            yield from range_ids(
                src, id_field=self.range_id_field, assign_ids=self.assign_ids, storage_options=self.so
            )


def _named(lists: Iterable[list[Any] | None]) -> list[Any]:
    return list(dict.fromkeys(i for ids in lists for i in ids or []))[:MAX_NAMED]


def _accepted_ids(
    layout: RunLayout, plans: list[Plan] | None, so: StorageOptions | None
) -> list[IdDigest | None]:
    """What a review took out of the pending sets, by the digests its plans recorded (``[None]`` when
    unknown): the rows accepted as they were, and those reviewers' decisions accepted or dropped."""
    if plans is None:  # the caller did not say: any accepted rows make the digests incomplete
        found = any(n.startswith("accepted-") for n in files.names(layout.results, so))
        return [None] if found else []
    accepted = [IdDigest.maybe(p.accepted) for p in plans if p.stop == ACCEPTED_BY_REVIEW]
    # what reviewers' decisions took out of a pending set: accepted into results, or dropped
    reviews = _reviews(layout, plans, so)
    decided = [IdDigest.maybe(a.get(k)) for a in reviews for k in ("accepted", "dropped")]
    # the spot checks no person decided, into results as the judge said (only where there were some)
    decided += [IdDigest.maybe(a["approved"]) for a in reviews if "approved" in a]
    return accepted + decided


def calibrations(layout: RunLayout, plans: list[Plan], so: StorageOptions | None) -> list[Calibration]:
    """The judge's calibration against the reviewers, per round whose decisions took effect."""
    return [
        c for r in sorted({p.round - 1 for p in plans if p.round}) if (c := read_calibration(layout, r, so))
    ]


def _reviews(layout: RunLayout, plans: list[Plan], so: StorageOptions | None) -> list[dict[str, Any]]:
    """What reviewers' decisions did, once per round whichever gate applied them."""
    return [a for r in sorted({p.round for p in plans}) if (a := review_applied(layout, r, so))]


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


def fan_out_figures(cfg: RunConfig, layout: RunLayout, so: StorageOptions | None) -> dict[str, Any] | None:
    """A fan-out's arms and the rows round 0 planned of the input's records (``None``: none)."""
    fan_out = cfg.fan_out_arms()
    if fan_out is None:
        return None
    shards = (read_manifest(JsonlDir(layout.input, storage_options=so)) or {}).get("shards") or []
    return {"arms": fan_out.as_json(), "rows": sum(int(s.get("records", 0)) for s in shards)}


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
        "",
        "| round | mode | pending | approved | rejected/exhausted | truncated | approval | failed shards "
        "| job s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in report["rounds"]:
        rate = "" if s.get("approval_rate") is None else f"{s['approval_rate']:.0%}"
        lines.append(
            f"| {s['round']} | {s['mode']} | {s['pending']} | {s['approved']} | "
            f"{s.get('rejected', s.get('exhausted', 0))} | {s.get('truncated', 0)} | {rate} | "
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


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def _kappa(value: float | None) -> str:
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
        notes = _cell("; ".join(d.notes), 200)
        lines.append(
            f"| {d.round} | {d.reviewed} | {d.spot_checks} | {_pct(d.agreement)} | {_kappa(d.kappa)} | "
            f"{_pct(d.precision)} | {_pct(d.recall)} | {_pct(d.coverage)} | {notes} |"
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
            f"| {b.bucket} | {b.rows if b.rows else '–'} | {_pct(b.judge_approval)} | {b.reviewed} | "
            f"{_pct(b.person_approval)} | {_pct(b.agreement)} |"
            for b in buckets
        ]
    return lines


def review_body(
    cfg: RunConfig,
    proposal: Proposal,
    so: StorageOptions | None = None,
    sample: int = 10,
    *,
    desk: str | None = None,
) -> str:
    """The markdown a reviewer sees on the Required Actions page before round slot ``proposal.plan``;
    ``desk`` is the URL of this gate on the review desk (:func:`desk_url`). Bounded whatever the rows
    hold: each text in it is cut (a cell to 80 characters, a reason of the controller's to
    :data:`MAX_BODY_TEXT`), and the whole to :data:`MAX_BODY_BYTES` (:func:`_fit`)."""
    layout = RunLayout(cfg.run_root)
    plan = proposal.plan
    history = [s for r in range(plan.round) if (s := read_summary(layout, r, so))]
    last = proposal.last
    lines = [
        f"**Run** {_cell(cfg.run_root, 2000)} · strategy **{_cut(cfg.strategy)}** · next: **{plan.slot}**",
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
    table = _sample_rows(pending, cfg.id_field or "id", sample, so)  # cut as each row is read
    lines += [
        "",
        f"**Rejected samples** (first {len(table)}):",
        "",
        "| id | prompt | output | judge's reason |",
    ]
    lines += ["| --- | --- | --- | --- |", *table]
    tail = [
        "",
        f"Full rejected set: {_cell(layout.pending(plan.round), 2000)}",
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
            f"| {c.round} | {c.reviewed} | {_pct(c.agreement)} | {_kappa(c.kappa)} | {_pct(c.precision)} | "
            f"{_pct(c.recall)} |"
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
        for row in JsonlFile(shard["uri"], storage_options=so).iter_records():
            prompt = row.get("prompt", row.get("question", ""))
            judgment = row.get("judgment") or {}
            out.append(
                f"| {_cell(row.get(id_field))} | {_cell(prompt)} | {_cell(row.get('result'))} | "
                f"{_cell(judgment.get('reason') or row.get('status'))} |"
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


def _cell(value: Any, width: int = 80) -> str:
    """Model output and record fields as literal text in a markdown table cell: never HTML, an
    image, a link or emphasis (the review page renders the body as markdown)."""
    raw = str("" if value is None else value)
    head = raw[: width * 8]  # whitespace runs fold to one space: enough to fill the cell, not MiBs
    text = " ".join(head.split())
    if len(text) > width or len(head) < len(raw):
        text = text[: width - 1] + "…"
    return _MARKUP.sub(r"\\\1", _AUTOLINK.sub("\\1\u2060", text))
