"""Paging a round's rows on the S3 server (the local-disk cases in tests/unit/review/test_browse.py)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from airflow_batchinfer.review.browse import RoundView
from airflow_batchinfer.review.decisions import Decision, DecisionLog, tally
from tests.support.review_rounds import all_pages, build_round, rejected_ids
from tests.support.seaweedfs import S3Server


@pytest.mark.s3
def test_paging_and_groups_on_s3(s3_server: S3Server, tmp_path: Path) -> None:
    so = s3_server.storage_options()
    base = f"s3://{s3_server.bucket}/{uuid.uuid4().hex}"
    cfg = build_round(base, n=45, per_shard=10, so=so, data_dir=tmp_path)
    view = RoundView(cfg.run_root, 0, so=so)
    expected = rejected_ids(45)
    assert view.total() == len(expected)
    assert [s.id for s in all_pages(view, size=4)[1]] == expected
    assert sum(view.groups().values()) == len(expected)
    found = view.find(expected[-1])
    assert found is not None and found.prompt is not None
    assert [s.id for s in view.sample(5, seed=1)] == [s.id for s in view.sample(5, seed=1)]
    log = DecisionLog(cfg.run_root, 0, so)
    log.append(Decision.make(0, "drop", "alice", ids=[expected[0]], note="junk"))
    log.append(Decision.make(0, "accept", "bob", filter={"text": "what is 1"}))
    assert [x.by for x in log.read()] == ["alice", "bob"]
    accepted = len([i for i in expected if i == "r001" or "r010" <= i <= "r019"])  # "What is 1…"
    assert tally(log.read(), view) == {"accept": accepted, "retry": len(expected) - accepted - 1, "drop": 1}
