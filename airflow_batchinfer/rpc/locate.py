"""Whether a job already runs somewhere: the decision before a (re)submission starts a copy.

A job id runs on at most one worker. Before submitting, the pool client asks every worker it knows
for the job; :func:`locate_decision` turns their answers into one of three verdicts:

- ``found``: a worker has a live (queued or running) copy: follow it there;
- ``not_found``: every worker that may run it answered and none has it: start it;
- ``unknown``: some worker that may run it did not answer: wait and ask again. Starting a copy now
  would run the job twice if that worker still runs it (a slow or paused worker, a network split).

A worker that does not answer stops counting once the pool no longer lists it among the workers that
may run a job (:class:`Workers`: a Kubernetes pod that is gone or has ended, a restarted local
worker on another port; a pod that is not Ready or is draining still counts), when its address
refuses connections (nothing listens there), or once it has not answered for
``unreachable_grace_s``: it is then taken for gone.
Pure: the pool client gathers the observations and acts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from airflow_batchinfer.state.timeouts import (
    LOCATE_TIMEOUT_S,
    SUBMIT_TIMEOUT_S,
    UNREACHABLE_GRACE_MAX_S,
    UNREACHABLE_GRACE_MIN_S,
    UNREACHABLE_GRACE_S,
)

__all__ = [
    "LOCATE_TIMEOUT_S",
    "SUBMIT_TIMEOUT_S",
    "UNREACHABLE_GRACE_MAX_S",
    "UNREACHABLE_GRACE_MIN_S",
    "UNREACHABLE_GRACE_S",
]

LocateVerdict = Literal["found", "not_found", "unknown"]


@dataclass(frozen=True)
class Workers:
    """A pool's workers as its discovery sees them (URLs without a trailing ``/``, each once).

    :param submit: the workers new jobs go to (ready, not draining).
    :param may_run: every worker that may still run a job it took earlier: those, and ones that are
        not ready or are draining (on Kubernetes, every pod of the Deployment that still exists and
        has not ended). A worker outside it is gone: it runs nothing."""

    submit: tuple[str, ...]
    may_run: tuple[str, ...]

    def __post_init__(self) -> None:  # a worker one may submit to may run what it took
        submit = _urls(self.submit)
        object.__setattr__(self, "submit", submit)
        object.__setattr__(self, "may_run", _urls((*self.may_run, *submit)))

    @classmethod
    def of(cls, urls: Iterable[str]) -> Workers:
        """A pool whose listed workers are the ones that may run jobs (static URLs, a local pool)."""
        listed = tuple(urls)
        return cls(submit=listed, may_run=listed)


def _urls(urls: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(u.rstrip("/") for u in urls))  # in order, each once


# A copy in these states is followed, never duplicated. A succeeded one is not: its manifest (checked
# first) is the truth, and a worker runs a succeeded job again once that is gone.
LIVE = ("queued", "running")


@dataclass(frozen=True)
class WorkerAnswer:
    """What asking one worker for a job showed.

    :param url: the worker.
    :param state: the job's state there; ``None`` when the worker does not know the job or did not
        answer.
    :param answered: whether it answered (a 404 is an answer: it does not have the job).
    :param unreachable_s: how long it has not answered, over this client's asks (0 when it answered).
    :param listed: whether the pool still lists it among the workers that may run a job
        (:attr:`Workers.may_run`; a worker seen earlier may be gone).
    :param refused: it did not answer because its address refused the connection (nothing listens
        there: a process that is gone runs nothing), not because an answer did not come or the
        address could not be reached (a slow, paused or cut-off worker may still run the job).
    :param error: why it did not answer."""

    url: str
    state: str | None = None
    answered: bool = True
    unreachable_s: float = 0.0
    listed: bool = True
    refused: bool = False
    error: str = ""


@dataclass(frozen=True)
class Located:
    """The verdict, the worker to follow (``found``), the workers waited for (``unknown``) and the
    silent ones taken for gone, each as ``(url, why)``."""

    verdict: LocateVerdict
    url: str | None = None
    waiting: tuple[tuple[str, str], ...] = ()
    gone: tuple[tuple[str, str], ...] = ()


def locate_decision(answers: Sequence[WorkerAnswer], *, grace_s: float) -> Located:
    """The verdict on one round of answers (see the module doc)."""
    live = next((a for a in answers if a.answered and a.state in LIVE), None)
    if live is not None:
        return Located("found", url=live.url)
    waiting: list[tuple[str, str]] = []
    gone: list[tuple[str, str]] = []
    for a in answers:
        if a.answered:
            continue
        if not a.listed:
            why = (
                f"the pool no longer lists it among the workers that may run a job, "
                f"e.g. its pod is gone or has ended ({a.error})"
            )
        elif a.refused:
            why = f"refuses connections, so no worker runs there ({a.error})"
        elif a.unreachable_s >= grace_s:
            why = (
                f"unreachable for {a.unreachable_s:.0f} s, past unreachable_grace_s "
                f"({grace_s:.0f} s): {a.error}"
            )
        else:  # not gone yet: the next round may find it
            why = f"unreachable for {a.unreachable_s:.0f} s of unreachable_grace_s {grace_s:.0f} s: {a.error}"
            waiting.append((a.url, why))
            continue
        gone.append((a.url, why))
    return Located("unknown" if waiting else "not_found", waiting=tuple(waiting), gone=tuple(gone))
