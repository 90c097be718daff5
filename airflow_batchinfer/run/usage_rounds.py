"""The run's GPU-seconds where its documents are written: each round summary's ``usage`` (the run up
to that round's close, the round's own span from its jobs) and the run report's (every closed
round's span, from the summaries). The figures come from :func:`~airflow_batchinfer.run.usage.account_usage`;
reading the events is best effort: an account that cannot be made says why (``known`` false) and
never fails a close or a report."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence

from airflow_batchinfer.run.usage import RoundSpan, account_usage
from airflow_batchinfer.state.docs.jobs import JobFigures
from airflow_batchinfer.state.docs.summary import Summary, WorkerTotals
from airflow_batchinfer.state.docs.usage import read_usage
from airflow_batchinfer.state.docs.usage_account import UsageAccount
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage.location import StorageOptions

log = logging.getLogger(__name__)


def round_span(
    slot: str, r: int, jobs: Iterable[JobFigures], workers: dict[str, WorkerTotals]
) -> RoundSpan | None:
    """A round's span from its jobs' timings (``None``: no job ran) and its engines' busy
    worker-seconds (each worker's batcher busy time, at most the span: a worker's concurrent jobs
    each count the batches they shared)."""
    timings = [j.timings for j in jobs]
    if not timings:
        return None
    start = min(t.started_at for t in timings)
    end = max(t.finished_at for t in timings)
    busy = sum(min(w.engine_busy_s, end - start) for w in workers.values())
    return RoundSpan(slot, r, start, end, busy)


def summary_spans(summaries: Sequence[Summary]) -> list[RoundSpan]:
    """Each closed round's own span, as its summary's ``usage`` recorded it (a summary from before
    the accounting has none)."""
    out = []
    for s in summaries:
        own = next((u for u in (s.usage.rounds if s.usage else []) if u.round == s.round), None)
        if own is not None:
            out.append(RoundSpan(s.slot, s.round, own.started_at, own.ended_at, own.busy_s))
    return out


def run_usage(
    layout: RunLayout, spans: Sequence[RoundSpan], so: StorageOptions | None, until: float | None = None
) -> UsageAccount:
    """The run's account up to ``until`` (now), from its stored usage events and ``spans``."""
    try:
        events = read_usage(layout, so)
    except Exception as exc:  # the accounting is a report: a close or a report never fails over it
        log.warning("usage: the events under %s could not be read: %s", layout.usage, exc)
        return UsageAccount(known=False, note=f"the usage events could not be read: {exc}")
    return account_usage(events, spans, time.time() if until is None else until)


def with_summary_spans(closed: Sequence[Summary], this: RoundSpan | None) -> list[RoundSpan]:
    """The spans of the rounds closed before, and this one's."""
    spans = [s for s in summary_spans(closed) if this is None or s.round != this.round]
    return sorted([*spans, *([this] if this else [])], key=lambda s: s.started_at)
