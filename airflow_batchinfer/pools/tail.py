"""How many replicas a round's tail still needs, and which pods a Kubernetes scale-down removes:
pure decisions, shared by the lane driver (which lowers its run's demand as lanes end) and the pools
(which act on it).

A round runs by lanes, each one shard job at a time; as lanes find no shard left they end, and
the workers their jobs ran on idle until the round closes. :func:`tail_replicas` is what the run
still needs then; the pool stops idle workers beyond it (a local pool at once, a Kubernetes pool
after ``scaledown_ttl_s``), never one with a running job. A Kubernetes ReplicaSet picks the pods it
removes itself: :func:`deletion_costs` ranks them through ``controller.kubernetes.io/pod-deletion-cost``
so the idle ones go first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
# Pods without the annotation cost 0: idle ones go before those, busy ones after.
BUSY_COST, IDLE_COST = 1000, -1000


def tail_replicas(
    shards_left: int, lanes_running: int, concurrency: int, busy_replicas: int, ceiling: int
) -> int:
    """The replicas a round still needs: enough slots for the lanes that can still run a shard
    (``min(lanes_running, shards_left)`` at ``concurrency`` jobs per worker), never fewer than the
    workers running a job (``busy_replicas``), never more than ``ceiling``, and at least 1 while the
    run lives (its close and its next round need a worker)."""
    lanes = max(0, min(lanes_running, shards_left))
    needed = math.ceil(lanes / max(1, concurrency))
    return max(1, min(max(needed, busy_replicas), ceiling))


def deletion_costs(busy: Mapping[str, bool | None]) -> dict[str, str]:
    """The ``pod-deletion-cost`` annotation of each pod whose state is known (pod name -> running a
    job?): busy pods high, idle ones low; a pod that could not be asked (``None``) keeps its cost."""
    return {pod: str(BUSY_COST if b else IDLE_COST) for pod, b in busy.items() if b is not None}
