"""Simultaneous claims of a run root, on local disk and on the S3 server (the rest in
tests/unit/run/test_owner.py)."""

from __future__ import annotations

import threading

from airflow_batchinfer.state.owner import (
    RunIdentity,
    claim,
    read_owner,
)
from tests.support.roots import Root


def test_simultaneous_claims_leave_exactly_one_owner(root: Root) -> None:
    """Eight DAG runs claim one root at once (each sees the others as running): one claims it, the
    seven others refuse, and the record names the one that claimed it."""
    run_root = root.uri("run")
    runs = [RunIdentity("llm_eval", f"manual__{k}") for k in range(8)]
    decisions: dict[RunIdentity, str] = {}
    start = threading.Barrier(len(runs))

    def run(me: RunIdentity) -> None:
        start.wait()
        decisions[me] = claim(run_root, me, lambda other: "running", root.storage_options).action

    threads = [threading.Thread(target=run, args=(me,)) for me in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (winner,) = [me for me, action in decisions.items() if action == "claim"]
    assert sorted(decisions.values()) == ["claim"] + ["refuse"] * 7
    stored = read_owner(run_root, root.storage_options)
    assert stored is not None and (stored["dag_id"], stored["run_id"]) == (winner.dag_id, winner.run_id)
