"""Concurrent decisions on the review log, on local disk and on the S3 server (the rest in
tests/unit/review/test_decisions.py)."""

from __future__ import annotations

import threading

from airflow_batchinfer.exceptions import ReviewClosedError
from airflow_batchinfer.review.decisions import (
    Decision,
    DecisionLog,
)
from tests.support.roots import Root


def test_concurrent_appends_lose_nothing(root: Root) -> None:
    """10 reviewers deciding at once, on a local disk (file lock) and on the real S3 server (a
    compare-and-swap on the ETag): every decision is in the log."""
    run_root, so = root.uri("run"), root.storage_options
    barrier = threading.Barrier(10)
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            barrier.wait()
            for j in range(5):  # each thread its own DecisionLog, as each request has
                DecisionLog(run_root, 0, so).append(Decision.make(0, "drop", f"user{k}", ids=[f"{k}-{j}"]))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    got = DecisionLog(run_root, 0, so).read()
    assert len(got) == 50 and {x.ids[0] for x in got} == {f"{k}-{j}" for k in range(10) for j in range(5)}


def test_decisions_racing_the_seal_are_applied_or_refused(root: Root) -> None:
    """Reviewers deciding while the answered gate's task seals the log: every decision that was
    recorded is among those the seal returns (applied), every other one was refused (409)."""
    run_root, so = root.uri("run"), root.storage_options
    barrier = threading.Barrier(7)
    recorded: list[str] = []
    refused: list[str] = []
    sealed: list[list[Decision]] = []

    def reviewer(k: int) -> None:
        barrier.wait()
        for j in range(4):
            sid = f"{k}-{j}"
            try:
                DecisionLog(run_root, 0, so).append(Decision.make(0, "drop", f"user{k}", ids=[sid]))
                recorded.append(sid)
            except ReviewClosedError:
                refused.append(sid)

    def gate_task() -> None:
        barrier.wait()
        sealed.append(DecisionLog(run_root, 0, so).seal())

    threads = [threading.Thread(target=reviewer, args=(k,)) for k in range(6)]
    threads.append(threading.Thread(target=gate_task))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    applied = sorted(x.ids[0] for x in sealed[0])
    assert applied == sorted(recorded) and len(recorded) + len(refused) == 24
    assert sorted(x.ids[0] for x in DecisionLog(run_root, 0, so).read()) == applied
