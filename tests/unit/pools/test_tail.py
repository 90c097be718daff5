"""The tail's decisions: how many replicas a round still needs, which pods a scale-down removes."""

from __future__ import annotations

import pytest

from airflow_batchinfer.pools.tail import BUSY_COST, IDLE_COST, deletion_costs, tail_replicas


@pytest.mark.parametrize(
    ("shards_left", "lanes_running", "concurrency", "busy", "ceiling", "want"),
    [
        (40, 16, 4, 4, 4, 4),  # the round in full swing: every replica
        (30, 6, 4, 2, 4, 2),  # 6 lanes still running at 4 slots a worker: 2
        (2, 6, 4, 1, 4, 1),  # more lanes than shards: the shards bound it
        (3, 3, 1, 3, 4, 3),
        (1, 1, 1, 3, 4, 3),  # never below the workers running a job
        (0, 0, 2, 0, 4, 1),  # the last lane ended: one stays for the close and the next round
        (50, 50, 1, 0, 4, 4),  # never above the ceiling
        (5, 5, 1, 9, 4, 4),
    ],
)
def test_tail_replicas(
    shards_left: int, lanes_running: int, concurrency: int, busy: int, ceiling: int, want: int
) -> None:
    assert tail_replicas(shards_left, lanes_running, concurrency, busy, ceiling) == want


def test_idle_pods_cost_less_than_busy_ones_and_unknown_ones_keep_theirs() -> None:
    costs = deletion_costs({"busy": True, "idle": False, "starting": None})
    assert costs == {"busy": str(BUSY_COST), "idle": str(IDLE_COST)}
    assert int(costs["idle"]) < 0 < int(costs["busy"])  # pods without the annotation cost 0
