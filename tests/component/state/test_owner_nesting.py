"""Issue 37, item 10: a new run root may not nest with another DAG's, on each store the docs name:
the walk below a new root (a directory at a time, stopping at the first foreign owner record) and
the look above it find the other DAG's ``owner.json`` on the real S3 server as on local disk."""

from __future__ import annotations

import pytest

from airflow_batchinfer.state.owner import RunIdentity, nesting_refusal
from airflow_batchinfer.storage.json_doc import write_json
from airflow_batchinfer.storage.location import resolve
from tests.support.owners import write_owner
from tests.support.roots import Root

pytestmark = pytest.mark.security

FINANCE = RunIdentity("finance", "scheduled__2026-01-01T00:00:00+00:00")
SCRATCH = RunIdentity("scratch", "manual__2026-01-02T00:00:00+00:00")


def test_a_new_run_root_nests_in_no_other_dags_on_either_store(root: Root) -> None:
    so = root.storage_options
    finance = root.uri("runs", "fin", "q1")
    write_owner(finance, FINANCE, so)
    write_json(resolve(root.uri("runs", "fin", "q1", "round-00", "plan.json"), so), {"a": 1})
    write_json(resolve(root.uri("runs", "mine", "data", "x.json"), so), {"a": 1})  # no owner below

    def refusal(*parts: str, me: RunIdentity = SCRATCH) -> str | None:
        return nesting_refusal(root.uri(*parts), me, so, prefixes=[root.base])

    assert f"would hold the run root {finance}" in (refusal("runs") or "")
    assert f"lies inside the run root {finance}" in (refusal("runs", "fin", "q1", "results") or "")
    assert refusal("runs", "mine") is None  # objects below, none an owner record
    assert refusal("runs", "new") is None  # nothing there yet
    assert refusal("runs", me=RunIdentity("finance", "later")) is None  # its own DAG's
