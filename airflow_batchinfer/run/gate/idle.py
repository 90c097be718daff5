"""What a review gate does with the run's GPUs while it waits (the ``gate_idle`` run setting), and
what the answer must do to get them back: the lease rules of a gate, as pure functions (no pool,
no socket, no Airflow), so that the controller, the gate's text and the tests agree.

- ``keep``: the lease is renewed for the whole wait (``response_timeout`` and a lease period); the
  workers stay warm however long the gate waits.
- ``sleep``: the lease is kept as for ``keep``; each worker's engine sleeps once idle
  ``gate_keep_warm_s`` (its GPU memory freed) and wakes on the answer. Refused where the engine cannot.
- ``release``: the lease is renewed at the gate's opening for ``gate_keep_warm_s`` only, so it lapses
  by itself then, and the pool scales to zero ``idle_ttl_s`` later when no other run holds it (local
  workers exit by themselves, a Kubernetes pool is scaled by the reaper). The answer re-takes it.
- ``auto``: ``release`` where the pool can scale (local, Kubernetes), ``keep`` on a static pool
  (its workers are not ours to release).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.worker.leases import DEFAULT_LEASE_TTL_S

GateAction = Literal["keep", "sleep", "release"]
AnswerAction = Literal["nothing", "wake", "rewarm"]
SCALABLE = ("local", "kubernetes")  # the backends whose workers follow the leases
SLEEP_LEVEL = 1  # weights to CPU memory, KV cache freed: a wake is seconds, not a model load


@dataclass(frozen=True)
class GateIdle:
    """What the gate's opening does.

    :param action: what the workers do while the gate waits.
    :param lease_ttl_s: the run's lease is renewed (``keep``, ``sleep``) or taken again (``release``:
        its expiry set, not only pushed later) for this long from the opening.
    :param sleep_after_s: ``sleep``: each worker sleeps once idle this long; else ``None``.
    :param text: what happens to the GPUs and for how long, for the gate's body and the log."""

    action: GateAction
    lease_ttl_s: float
    sleep_after_s: float | None
    text: str


def gate_refusal(policy: str, backend: str, sleep_refusal: str | None = None) -> str | None:
    """Why ``policy`` cannot hold on a ``backend`` pool whose engine says ``sleep_refusal`` (``None``:
    it can sleep), with the remedy; ``None`` when it can. Asked at a round's start, before any gate."""
    if policy in ("release", "sleep") and backend not in SCALABLE:
        return (
            f"gate_idle {policy}: the run's pool is a {backend} pool, whose workers are run outside "
            "Airflow: a run has nothing of them to release or put to sleep. Remedy: set gate_idle to "
            "keep or auto"
        )
    if policy == "sleep" and sleep_refusal is not None:
        return (
            f"gate_idle sleep: the pool's engine cannot sleep ({sleep_refusal}). Remedy: set gate_idle "
            "to release (the answer re-warms the pool) or keep"
        )
    return None


def resolve(policy: str, backend: str) -> GateAction:
    """The action ``policy`` takes on a ``backend`` pool (``auto``: release where it can scale)."""
    if policy == "auto":
        return "release" if backend in SCALABLE else "keep"
    if policy not in ("keep", "sleep", "release"):
        raise ConfigError(f"gate_idle {policy!r}: choose one of auto, keep, sleep, release")
    return policy  # type: ignore[return-value]


def gate_idle(
    policy: str,
    *,
    backend: str,
    keep_warm_s: float,
    response_timeout_s: float | None,
    sleep_refusal: str | None = None,
    other_leases: int | None = None,
    idle_ttl_s: float | None = None,
    last_warm_s: float | None = None,
) -> GateIdle:
    """What the gate's opening does (see the module doc). ``other_leases``: live leases of other runs
    on the pool now (``None``: not known); ``idle_ttl_s``: the pool's; ``last_warm_s``: how long its
    last (re)start took, for the text. Raises :class:`ConfigError` where :func:`gate_refusal` refuses."""
    refusal = gate_refusal(policy, backend, sleep_refusal)
    if refusal is not None:
        raise ConfigError(refusal)
    action = resolve(policy, backend)
    wait = response_timeout_s or 0.0
    held = DEFAULT_LEASE_TTL_S + wait  # outlasts the wait: a lane task renews it after the answer
    warm = span(keep_warm_s)
    if action == "keep":
        why = " (a static pool: nothing of this run's to release)" if policy == "auto" else ""
        upto = f" (up to {span(wait)})" if wait else ""
        text = f"GPUs: kept warm while this gate waits{upto}{why}; answering finds them warm."
        return GateIdle("keep", held, None, text)
    if action == "sleep":
        text = (
            f"GPUs: kept warm {warm}, then each worker's engine sleeps (GPU memory freed, this run's lease "
            "kept); answering wakes them (seconds, no model load)."
        )
        return GateIdle("sleep", held, keep_warm_s, text)
    if idle_ttl_s is None:
        scale = "the pool scales to zero after its idle_ttl"
    elif math.isinf(idle_ttl_s):
        scale = "the pool keeps its workers all the same (its idle_ttl_s is unset)"
    else:
        scale = f"the pool scales to zero after its idle_ttl ({span(idle_ttl_s)})"
    others = "" if other_leases is None else f" ({other_leases} {'does' if other_leases == 1 else 'do'} now)"
    rewarm = f"~{last_warm_s:.0f} s, the last start" if last_warm_s is not None else "the model loads again"
    text = (
        f"GPUs: kept warm {warm}, then this run's lease is given back; {scale} unless another run holds "
        f"it{others}; answering re-warms it ({rewarm})."
    )
    return GateIdle("release", keep_warm_s, None, text)


def answer_action(*, lease_live: bool, ready: int, wanted: int, asleep: bool) -> AnswerAction:
    """What the gate's answer does before the round runs, from what it observes: the run's lease
    (still live?), the pool's ready workers against the ``wanted`` replicas, and whether any worker
    sleeps. ``rewarm``: take the lease again and wait (deferred) for the workers; ``wake``: wake the
    sleeping workers; ``nothing``: the pool is as the round needs it."""
    if not lease_live or ready < wanted:
        return "rewarm"  # a sleeping worker among them wakes with its first job
    return "wake" if asleep else "nothing"


def span(seconds: float) -> str:
    """``seconds`` as a person reads a wait: ``45 s``, ``5 min``, ``2.5 h``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f}".removesuffix(".0") + " h"
