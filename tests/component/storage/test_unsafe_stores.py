"""Issue 22, item 9f: what many processes write at once needs a compare-and-swap. On a store without
conditional writes (fsspec's ``memory://`` stands for GCS, Azure and the rest) concurrent review
decisions were lost (the last writer won) and run-owner claims relied on a read-back 1 s later.
Both are refused there now, naming the store and the remedy, before anything is read or written."""

from __future__ import annotations

import re
import uuid

import fsspec
import pytest

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.review.decisions import Decision, DecisionLog
from airflow_batchinfer.state.owner import RunIdentity, claim, owner_uri
from airflow_batchinfer.storage.location import resolve
from tests.support.roots import Root

pytestmark = pytest.mark.security

ME = RunIdentity("llm_eval", "manual__2026-01-02T00:00:00+00:00")
REMEDY = r"Remedy: put the run root on a local disk of one host.*S3 / an S3-compatible server"


def memory_root() -> str:
    return f"memory://unsafe-{uuid.uuid4().hex}/run"


def test_a_review_decision_is_refused_where_it_could_be_lost() -> None:
    root = memory_root()
    log = DecisionLog(root, 0)
    with pytest.raises(
        ConfigError, match=rf"review decision on round 0 of {root}.*memory:// store.*{REMEDY}"
    ):
        log.append(Decision.make(0, "drop", "alice", ids=["r1"]))
    assert not fsspec.filesystem("memory").exists(resolve(log.uri).path)  # nothing written
    assert log.read() == []
    assert log.seal() == []  # the run's own single write: the gate is still answered there


def test_a_run_owner_claim_is_refused_before_anything_is_read_or_written() -> None:
    root = memory_root()
    asked: list[RunIdentity] = []

    def state_of(run: RunIdentity) -> str | None:
        asked.append(run)
        return "success"

    with pytest.raises(
        ConfigError, match=rf"Claiming the run root {re.escape(f'{root} for DAG run {ME}')}.*{REMEDY}"
    ):
        claim(root, ME, state_of)
    assert asked == [] and not fsspec.filesystem("memory").exists(resolve(owner_uri(root)).path)


def test_local_disk_and_s3_still_take_both(root: Root) -> None:
    run_root = root.uri("run")
    assert claim(run_root, ME, lambda run: None, root.storage_options).action == "claim"
    log = DecisionLog(run_root, 0, root.storage_options)
    assert len(log.append(Decision.make(0, "accept", "alice", ids=["r1"]))) == 1
