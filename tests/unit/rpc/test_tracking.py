from __future__ import annotations

import pytest

from airflow_batchinfer.rpc.tracking import Observation, next_action


@pytest.mark.parametrize(
    ("obs", "lost_since", "now", "action"),
    [
        (Observation("status", "running"), None, 0, "wait"),
        (Observation("status", "queued"), None, 0, "wait"),
        (Observation("status", "succeeded"), None, 0, "done"),
        (Observation("status", "failed"), None, 0, "failed"),
        (Observation("status", "cancelled"), None, 0, "failed"),
        (Observation("not_found", manifest_found=True), 0, 0, "done"),
        (Observation("not_found"), 0, 0, "resubmit"),
        (Observation("unreachable", manifest_found=True), 0, 1, "done"),
        (Observation("unreachable"), 0, 5, "wait"),  # a blip: don't run the job twice
        (Observation("unreachable"), 0, 30, "resubmit"),  # gone for longer than the grace period
    ],
)
def test_next_action(obs: Observation, lost_since: float | None, now: float, action: str) -> None:
    assert next_action(obs, lost_since=lost_since, now=now, grace_s=20) == action
