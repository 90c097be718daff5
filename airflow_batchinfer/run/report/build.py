"""The run report's gathering: ``report/summary.json`` from the files the rounds left in storage
(plans, summaries, job manifests, lane documents), written with ``report/report.md``
(:mod:`~airflow_batchinfer.run.report.render`) and the SVG plots
(:mod:`~airflow_batchinfer.run.report.plots`). A round reports each of its shards' states and each
lane's figures (``shard_status``, one Airflow task per lane, not per shard:
:class:`~airflow_batchinfer.state.docs.shard_status.RoundShards`)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from airflow_batchinfer.engines.stats import CounterName
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.run.close import WORKER_FIELDS
from airflow_batchinfer.run.jobs import round_kinds
from airflow_batchinfer.run.plan import (
    ACCEPTED_BY_REVIEW,
    IN_PLACE_DONE,
    MAX_ROUNDS,
    NOTHING_PENDING,
    STOPPED_BY_REVIEW,
    pending_shards,
)
from airflow_batchinfer.run.preflight import retry_warnings
from airflow_batchinfer.run.report.final_pending import export_final_pending
from airflow_batchinfer.run.report.invariant import applied_reviews, check_invariant
from airflow_batchinfer.run.report.plots import plots
from airflow_batchinfer.run.report.render import render_markdown
from airflow_batchinfer.run.usage import RoundSpan
from airflow_batchinfer.run.usage_rounds import round_span, run_usage
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import (
    AcceptedJob,
    EngineTelemetry,
    Plan,
    Summary,
    read_accepted,
    read_plan,
    read_summary,
    review_applied,
    slots,
)
from airflow_batchinfer.state.docs.calibration import Calibration, read_calibration
from airflow_batchinfer.state.docs.preflight import read_preflight
from airflow_batchinfer.state.docs.report import RunReport, write_report_doc
from airflow_batchinfer.state.docs.shard_status import RoundShards, round_status
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlDir
from airflow_batchinfer.storage.json_doc import write_bytes
from airflow_batchinfer.storage.location import StorageOptions, join, resolve
from airflow_batchinfer.storage.manifest import read_manifest
from airflow_batchinfer.storage.shard_ref import RangeRef, ShardRef

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
    plans = [p for s in slots(cfg.retries.max_rounds) if (p := read_plan(layout, s, so))]
    ran = [p for p in plans if p.mode != "skip"]
    summaries = {p.slot: read_summary(layout, p.round, so) for p in ran}
    rounds = [s for s in summaries.values() if s]
    stop = next((p.stop for p in plans if p.stop), None)
    in_place_ran = any(p.mode == "in_place" for p in ran)
    stop = stop or (IN_PLACE_DONE if in_place_ran else NOTHING_PENDING)
    status = STATUS[stop]
    # Every slot plans (a skip too) and every round that ran closes: a run where one did not (an
    # upstream task failed: the shard task, the pool setup, a plan or a close) has not finished.
    unplanned = [s for s in slots(cfg.retries.max_rounds) if s not in {p.slot for p in plans}]
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
    id_field = cfg.data.id_field or "id"
    invariant = check_invariant(layout, id_field, final_pending, rounds, failed, so, plans=plans)
    if cfg.data.output_format == "parquet":
        export_final_pending(layout, final_pending, id_field, so)
    if failed and len(failed) > cfg.budget.max_failed_shards and status != INCOMPLETE:
        status = "failed_shards"
    reviews = applied_reviews(layout, plans, so)
    input_manifest = read_manifest(JsonlDir(layout.input, storage_options=so))
    preflight = read_preflight(layout, so)
    shard_status = shard_figures(layout, ran, summaries, so)
    closed = [p for p in ran if summaries.get(p.slot)]
    accepted = accepted_jobs(cfg, layout, closed, so)
    report = {
        "run_root": cfg.run_root,
        "strategy": cfg.retries.strategy,
        "status": status,
        "stop_reason": reason,
        "input": None if input_manifest is None else input_manifest.counts,
        "fan_out": fan_out_figures(cfg, layout, so),
        "rounds": [s.to_json() for s in rounds],
        # What each slot decided; the settings its round ran (templates, judge) stay in its plan.json.
        "plans": [{**p.model_dump(mode="json", exclude={"config"}), "shards": len(p.shards)} for p in plans],
        # the judge's approvals: into results at each close, and spot checks no person decided after it
        "approved": sum(s.approved for s in rounds) + sum(a.counts.get("approve", 0) for a in reviews),
        "accepted_by_review": (_count_rows(layout, "accepted-", so) if stop == ACCEPTED_BY_REVIEW else 0)
        + sum(a.accepted.count for a in reviews),
        "dropped_by_review": sum(a.dropped.count for a in reviews),
        # the reviewers' decisions per reviewed round, as they took effect
        "reviews": [a.to_json() for a in reviews],
        # the judge against the reviewers, per reviewed round (round-NN/review/calibration.json)
        "calibration": [c.to_json() for c in calibrations(layout, plans, so)],
        "remaining_pending": sum(s.records for s in final_pending),
        # where it is: what a review's decisions left pending, or the round's pending set
        "remaining_pending_uri": _pending_uri(layout, r_next, so) if final_pending else None,
        "exhausted_in_place": exhausted,
        "failed_shards": [f.to_json() for f in failed],
        "max_failed_shards": cfg.budget.max_failed_shards,
        # per round a lane started: its shards by state, per lane, the failed ones
        "shard_status": [f.to_json() for f in shard_status],
        "preflight": None if preflight is None else preflight.to_json(),
        # what the settings alone warn of: also with the pre-flight's sample off, and for the CLI's runs
        "warnings": retry_warnings(cfg),
        "workers": _per_worker(rounds),
        "engine": engine_rounds(closed, accepted),
        # GPU-seconds leased, busy, idle at gates and in tails, re-warms, what keep would cost
        "usage": run_usage(layout, _spans(closed, summaries, accepted), so).model_dump(mode="json"),
        "invariant": invariant,
    }
    doc = RunReport.model_validate(report)  # what the renderers read is what summary.json holds
    write_report_doc(layout, doc, so)
    report = doc.to_json()
    write_bytes(resolve(join(layout.report, "report.md"), so), render_markdown(report).encode())
    for name, svg in plots(report).items():
        write_bytes(resolve(join(layout.report, name), so), svg)
    return report


def shard_figures(
    layout: RunLayout, ran: list[Plan], summaries: dict[str, Summary | None], so: StorageOptions | None
) -> list[RoundShards]:
    """The shard figures of each round that ``ran`` and a lane started (one that none started has
    none); a closed round's quarantine records come from its summary."""
    out = []
    for plan in ran:
        summary = summaries.get(plan.slot)
        failed = None if summary is None else summary.failed_shards
        status = round_status(layout, plan, so, failed=failed)
        if status.started:
            out.append(status.figures())
    return out


def _pending_uri(layout: RunLayout, r: int, so: StorageOptions | None) -> str:
    return layout.reviewed(r) if review_applied(layout, r, so) else layout.pending(r)


def _pending(layout: RunLayout, r: int, status: str, so: StorageOptions | None) -> list[ShardRef | RangeRef]:
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


def accepted_jobs(
    cfg: RunConfig, layout: RunLayout, closed: list[Plan], so: StorageOptions | None
) -> dict[str, list[AcceptedJob]]:
    """Per closed round (by slot), the jobs its close accepted (a quarantined shard's have none)."""
    out = {}
    for plan in closed:
        kinds = round_kinds(plan.effective_config(cfg), plan.mode)
        uris = [layout.accepted(plan.round, s.shard_id, kind) for s in plan.shards for kind in kinds]
        with ThreadPoolExecutor(8) as ex:
            docs = list(ex.map(lambda uri: read_accepted(uri, so), uris))
        out[plan.slot] = [d for d in docs if isinstance(d, AcceptedJob)]
    return out


def _spans(
    closed: list[Plan], summaries: dict[str, Summary | None], accepted: dict[str, list[AcceptedJob]]
) -> list[RoundSpan]:
    """Each closed round's span and busy time, from its accepted jobs and its summary's workers."""
    spans = []
    for plan in closed:
        summary = summaries[plan.slot]
        assert summary is not None  # closed: it has one
        if span := round_span(plan.slot, plan.round, accepted[plan.slot], summary.workers):
            spans.append(span)
    return spans


def engine_rounds(closed: list[Plan], accepted: dict[str, list[AcceptedJob]]) -> list[dict[str, Any]]:
    """Per closed round, its engines' figures over the jobs close accepted (their manifests'
    ``engine_stats``, copied into the accepted docs; :func:`round_engine`). A round none of whose
    jobs has any (engines without stats) is left out."""
    out = []
    for plan in closed:
        jobs = [d.engine_stats for d in accepted[plan.slot] if d.engine_stats is not None]
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


def calibrations(layout: RunLayout, plans: list[Plan], so: StorageOptions | None) -> list[Calibration]:
    """The judge's calibration against the reviewers, per round whose decisions took effect."""
    return [
        c for r in sorted({p.round - 1 for p in plans if p.round}) if (c := read_calibration(layout, r, so))
    ]


def fan_out_figures(cfg: RunConfig, layout: RunLayout, so: StorageOptions | None) -> dict[str, Any] | None:
    """A fan-out's arms and the rows round 0 planned of the input's records (``None``: none)."""
    fan_out = cfg.prompt.fan_out_arms()
    if fan_out is None:
        return None
    manifest = read_manifest(JsonlDir(layout.input, storage_options=so))
    shards = [] if manifest is None else manifest.shards
    return {"arms": fan_out.as_json(), "rows": sum(s.records for s in shards)}
