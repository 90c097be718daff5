"""Who is using a pool, and how many replicas it should have: the lease rules of every backend.

The workers read them too (a local worker idles out only when its pool's lease file lets it), so
they live on the worker side: ``pools/`` imports them from here, and the worker never imports
the pool manager.

Several Airflow runs (and ``batchinfer pool up``/``run``) may share one warm pool. Each holds a
*lease* (id → replicas wanted, expiry). A Kubernetes pool keeps them on its Deployment's annotations
(``batchinfer.io/leases``, updated with optimistic concurrency); a local pool in a file beside its
workers, under a lock. Either way any process (setup and teardown tasks, the CLI, the reaper, the
workers themselves) sees the same truth; none of it lives in process memory. A lease expires by
itself so a run that died without its teardown cannot pin GPUs forever; a live run renews it as its
lane tasks start and while its review gates wait.

The replica count follows from the leases:

- live leases: the largest number any of them wants now. A lease's demand starts at its *ceiling*
  (what the run's setup asked for) and follows the run's tail (:meth:`PoolState.want`: a round whose
  lanes are ending needs fewer, the next round takes them back). Fewer are removed only after
  demand has stayed below the replica count for ``scaledown_ttl_s`` (damps churn between overlapping runs);
- no live lease: the pool stays as it is until ``idle_ttl_s`` after its last use, then scales to zero.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

PREFIX = "batchinfer.io/"
LEASES = PREFIX + "leases"
LAST_USED = PREFIX + "last-used"
LOW_SINCE = PREFIX + "low-demand-since"
IDLE_TTL = PREFIX + "idle-ttl-s"
# A run's lease lapses after this long unless renewed (its lane tasks and review gates renew it).
DEFAULT_LEASE_TTL_S = 24 * 3600.0
SCALEDOWN_TTL = PREFIX + "scaledown-ttl-s"


def ttl_annotations(idle_ttl_s: float, scaledown_ttl_s: float) -> dict[str, str]:
    """The pool's lifecycle settings as annotations: the reaper reads them without the spec."""
    return {IDLE_TTL: f"{idle_ttl_s:g}", SCALEDOWN_TTL: f"{scaledown_ttl_s:g}"}


@dataclass
class Lease:
    """``replicas``: the run's demand now; ``ceiling``: what its setup asked for (``None`` in a
    document from before demands followed the tail: its ``replicas``)."""

    replicas: int
    acquired: float
    expires: float
    ceiling: int | None = None

    @property
    def most(self) -> int:
        """The most replicas this lease may want."""
        return self.replicas if self.ceiling is None else self.ceiling


def _float(value: str | None) -> float | None:
    return float(value) if value else None


@dataclass
class PoolState:
    replicas: int
    idle_ttl_s: float
    scaledown_ttl_s: float
    leases: dict[str, Lease] = field(default_factory=dict)
    last_used: float | None = None
    low_since: float | None = None

    @classmethod
    def from_annotations(
        cls, replicas: int, annotations: dict[str, str] | None, *, idle_ttl_s: float, scaledown_ttl_s: float
    ) -> PoolState:
        a = annotations or {}
        leases = {k: Lease(**v) for k, v in json.loads(a.get(LEASES) or "{}").items()}
        return cls(
            replicas=replicas,
            idle_ttl_s=float(a.get(IDLE_TTL) or idle_ttl_s),
            scaledown_ttl_s=float(a.get(SCALEDOWN_TTL) or scaledown_ttl_s),
            leases=leases,
            last_used=_float(a.get(LAST_USED)),
            low_since=_float(a.get(LOW_SINCE)),
        )

    def annotations(self) -> dict[str, str | None]:
        """For a merge patch: ``None`` removes an annotation."""
        return {
            LEASES: json.dumps({k: vars(v) for k, v in sorted(self.leases.items())}, sort_keys=True),
            LAST_USED: None if self.last_used is None else f"{self.last_used:.3f}",
            LOW_SINCE: None if self.low_since is None else f"{self.low_since:.3f}",
            **ttl_annotations(self.idle_ttl_s, self.scaledown_ttl_s),
        }

    def acquire(self, lease_id: str, replicas: int, *, now: float, ttl_s: float) -> None:
        self.leases[lease_id] = Lease(replicas=replicas, acquired=now, expires=now + ttl_s, ceiling=replicas)
        self.last_used = now

    def want(self, lease_id: str, replicas: int | None, *, now: float) -> bool:
        """Lower ``lease_id``'s demand to ``replicas``, or (``None``) take its ceiling back; its
        expiry is unchanged. A number only ever lowers it: lanes ending at once compute theirs from
        snapshots, and one that lands late must not raise it again. ``False`` if the lease is gone
        (lapsed or released)."""
        lease = self.leases.get(lease_id)
        if lease is None or lease.expires <= now:
            return False
        ceiling = lease.most
        lease.ceiling = ceiling
        lease.replicas = ceiling if replicas is None else max(0, min(replicas, lease.replicas, ceiling))
        self.last_used = now
        return True

    def renew(self, lease_id: str, *, now: float, ttl_s: float) -> bool:
        """Push ``lease_id``'s expiry to ``now + ttl_s`` (never earlier); ``False`` if it is gone."""
        lease = self.leases.get(lease_id)
        if lease is None or lease.expires <= now:
            return False
        lease.expires = max(lease.expires, now + ttl_s)
        self.last_used = now
        return True

    def release(self, lease_id: str, *, now: float) -> bool:
        self.last_used = now
        return self.leases.pop(lease_id, None) is not None

    def live(self, now: float) -> dict[str, Lease]:
        return {k: v for k, v in self.leases.items() if v.expires > now}

    def decide(self, now: float) -> int:
        """The replica count for ``now``; drops expired leases (their expiry counts as a last use)."""
        for key, lease in list(self.leases.items()):
            if lease.expires <= now:
                del self.leases[key]
                self.last_used = max(self.last_used or 0.0, lease.expires)
        if not self.leases and self.last_used is None:
            self.last_used = now  # never used (e.g. applied from k8s/): the idle clock starts now
        if self.leases:
            demand = max(lease.replicas for lease in self.leases.values())
        elif self.last_used is not None and now - self.last_used < self.idle_ttl_s:
            demand = self.replicas  # idle but within idle_ttl: stay warm for the next run
        else:
            demand = 0
        if demand >= self.replicas or not self.leases:
            self.low_since = None
            return demand
        if self.low_since is None:
            self.low_since = now
        if now - self.low_since >= self.scaledown_ttl_s:
            self.low_since = None
            return demand
        return self.replicas

    def idle_expired(self, now: float) -> bool:
        """No live lease and unused for ``idle_ttl_s``: a local worker with no job may exit. A lease
        that lapsed counts its expiry as a last use, as in :meth:`decide` (a gate's lease given back
        after ``gate_keep_warm_s`` leaves the pool warm ``idle_ttl_s`` more)."""
        if self.live(now):
            return False
        uses = [u for u in (self.last_used, *(v.expires for v in self.leases.values())) if u is not None]
        return not uses or now - max(uses) >= self.idle_ttl_s

    def to_dict(self) -> dict[str, Any]:
        """As a local pool stores it (``leases-<key>.json``)."""
        return {
            "replicas": self.replicas,
            "idle_ttl_s": self.idle_ttl_s,
            "scaledown_ttl_s": self.scaledown_ttl_s,
            "leases": {k: vars(v) for k, v in sorted(self.leases.items())},
            "last_used": self.last_used,
            "low_since": self.low_since,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PoolState:
        leases = {k: Lease(**v) for k, v in (data.get("leases") or {}).items()}
        return cls(
            replicas=int(data["replicas"]),
            idle_ttl_s=float(data["idle_ttl_s"]),
            scaledown_ttl_s=float(data.get("scaledown_ttl_s", 0.0)),
            leases=leases,
            last_used=data.get("last_used"),
            low_since=data.get("low_since"),
        )

    def describe(self, now: float) -> dict[str, Any]:
        return {
            "leases": {
                k: {
                    "replicas": v.replicas,
                    "ceiling": v.most,
                    "age_s": round(now - v.acquired, 1),
                    "expires_in_s": round(v.expires - now, 1),
                }
                for k, v in self.live(now).items()
            },
            "idle_for_s": None if self.leases or self.last_used is None else round(now - self.last_used, 1),
            "idle_ttl_s": self.idle_ttl_s,
            "scaledown_ttl_s": self.scaledown_ttl_s,
        }
