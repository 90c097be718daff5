"""Juries: several judges (LLM, model or rule judges) vote on each answer.

``{"type": "jury", "judges": [...], "vote": "majority" | "all" | "mean_score", "threshold": 0.5}``:

- ``majority``: approved when more than half the members approve (a tie rejects); the score is the
  share of members that approve.
- ``all``: approved when every member approves; the score is that share too.
- ``mean_score``: the score is the mean of the members' scores (a member that gives none counts 1 for
  an approval, 0 for a rejection: a rule judge's verdict as a certainty), approved at or above
  ``threshold`` (default 0.5). Scores on a raw scale do not average with probabilities: a ``reward``
  member is refused here.

Each member's verdict is kept in ``judgment.members`` (``name``, ``type``, ``approved``, ``reason``,
``score``); a member spec may carry a ``name`` (default: its type, ``-2``, ``-3``… for repeats). A
round counts how often the members disagree (:class:`~airflow_batchinfer.state.tally.JuryTally`,
:class:`JuryStats`).

Where members run: where the jury's job runs (the run's pool, or the judge pool when the run has
one), except in a jury that holds a model judge (``reward``, ``classifier``). That jury needs the
judge pool to serve the scoring model, and a scoring worker generates nothing: its ``llm`` members
are judged where the answers are generated, in each shard's infer job on the run's pool
(:meth:`Jury.judge_early`, params ``jury_at_inference``), their verdicts carried in the row
(:data:`CARRIED`) to the judge job, which runs the other members and votes. A member that needs
both kinds of model (an ``all`` of an ``llm`` and a ``classifier``) cannot be served by either
pool and is refused. The members a job runs judge a chunk at once (:func:`_together`): two ``llm``
members' requests share the worker's batches.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from airflow_batchinfer.engines.scoring import ScoringModel
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges import candidates
from airflow_batchinfer.judges.base import Generate, Judge, JudgeItem, Scorer, Verdict
from airflow_batchinfer.values import number

VOTES = ("majority", "all", "mean_score")
JURY_KEYS = frozenset({"judges", "vote", "threshold"})
NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
#: A row's (or a candidate's) field that carries the verdicts of the members judged where the answer
#: was generated, by member name, from the infer job to the judge job (which moves them into
#: ``judgment.members``).
CARRIED = candidates.JURY_VERDICTS


@dataclass(frozen=True)
class Member:
    """A jury member: its ``name``, its judge, and whether it is judged where the answers are
    generated (``early``: its verdict is carried in the row)."""

    name: str
    kind: str
    judge: Judge
    early: bool = False


def member_names(specs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Each member's name: its spec's ``name``, else its type (``-2``, ``-3``… for repeats);
    :class:`ConfigError` for a bad or repeated name."""
    names: list[str] = []
    for spec in specs:
        given = spec.get("name")
        if given is not None:
            if not isinstance(given, str) or not NAME.fullmatch(given):
                raise ConfigError(f"jury member name {given!r}: use 1 to 64 letters, digits, '_', '.' or '-'")
            name = given
        else:
            base, k = str(spec.get("type")), 1
            name = base
            while name in names:
                k += 1
                name = f"{base}-{k}"
        if name in names:
            raise ConfigError(f"jury members share the name {name!r}: give each its own name")
        names.append(name)
    return names


def vote(how: str, verdicts: Sequence[Verdict], threshold: float = 0.5) -> tuple[bool, float]:
    """The jury's decision on one answer from its members' ``verdicts``: approved, and its score."""
    n = len(verdicts)
    yes = sum(1 for v in verdicts if v.approved)
    if how == "majority":
        return 2 * yes > n, round(yes / n, 4)
    if how == "all":
        return yes == n, round(yes / n, 4)
    scores = [v.score if v.score is not None else (1.0 if v.approved else 0.0) for v in verdicts]
    mean = round(sum(scores) / n, 6)
    return mean >= threshold, mean


class Jury(Judge):
    """Members that vote (see the module).

    :param members: the members, in the spec's order (at least two).
    :param how: ``majority``, ``all`` or ``mean_score``.
    :param threshold: ``mean_score`` approves at or above it.
    """

    kind = "jury"

    def __init__(
        self, members: Sequence[Member], how: str = "majority", threshold: float | None = None
    ) -> None:
        if how not in VOTES:
            raise ConfigError(f"jury vote {how!r}: choose one of {', '.join(VOTES)}")
        if len(members) < 2:
            raise ConfigError("a jury needs at least two judges (one judge: use it alone)")
        if threshold is not None and how != "mean_score":
            raise ConfigError(f"jury: threshold is for vote mean_score, not {how}: remove it")
        if threshold is not None and (
            isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0 <= threshold <= 1
        ):
            raise ConfigError(f"jury: threshold must be a number in [0, 1], got {threshold!r}")
        if how == "mean_score" and (raw := [m.name for m in members if m.kind == "reward"]):
            raise ConfigError(
                f"jury: vote mean_score averages scores in [0, 1], and reward members ({', '.join(raw)}) "
                "score on their model's own scale: use a classifier, or vote majority or all"
            )
        self.members = list(members)
        self.how = how
        self.threshold = 0.5 if threshold is None else float(threshold)

    @property
    def early(self) -> list[Member]:
        """The members judged where the answers are generated (their verdicts carried in the row)."""
        return [m for m in self.members if m.early]

    async def judge(
        self, items: Sequence[JudgeItem], generate: Generate | None = None, scorer: Scorer | None = None
    ) -> list[Verdict]:
        here = [m for m in self.members if not m.early]
        judged = dict(
            zip((m.name for m in here), await _together(here, items, generate, scorer), strict=True)
        )
        columns = [
            [carried(item, m.name) for item in items] if m.early else judged[m.name] for m in self.members
        ]
        return [self.decide(list(found)) for found in zip(*columns, strict=True)]

    async def judge_early(self, items: Sequence[JudgeItem], generate: Generate) -> list[dict[str, Any]]:
        """The verdicts of the :attr:`early` members on ``items`` (by member name, as the row carries
        them): what an infer job adds to each answer it generates."""
        out: list[dict[str, Any]] = [{} for _ in items]
        for m, verdicts in zip(self.early, await _together(self.early, items, generate), strict=True):
            for found, v in zip(out, verdicts, strict=True):
                found[m.name] = v.as_dict()
        return out

    def decide(self, verdicts: list[Verdict]) -> Verdict:
        """The jury's verdict from its members' (in member order), each kept in ``members``."""
        approved, score = vote(self.how, verdicts, self.threshold)
        yes = sum(1 for v in verdicts if v.approved)
        against = [m.name for m, v in zip(self.members, verdicts, strict=True) if v.approved != approved]
        if self.how == "mean_score":
            reason = f"mean_score {score:.4f} {'>=' if approved else '<'} threshold {self.threshold:g}"
        else:
            reason = f"{self.how}: {yes} of {len(verdicts)} approve"
        if against:
            reason += f" ({'approved' if not approved else 'rejected'} by {', '.join(against)})"
        members = tuple(
            {"name": m.name, "type": m.kind, **v.as_dict()}
            for m, v in zip(self.members, verdicts, strict=True)
        )
        return Verdict(approved, reason, score, members)

    def serving_refusal(self, scoring: ScoringModel | None) -> str | None:
        """Of the members judged here (not the :attr:`early` ones)."""
        for m in self.members:
            if not m.early and (why := m.judge.serving_refusal(scoring)) is not None:
                return f"jury member {m.name}: {why}"
        return None

    def early_refusal(self, scoring: ScoringModel | None) -> str | None:
        """Why a worker serving ``scoring`` cannot judge the :attr:`early` members (an infer job's)."""
        for m in self.early:
            if (why := m.judge.serving_refusal(scoring)) is not None:
                return f"jury member {m.name}, judged where the answers are generated: {why}"
        return None

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "type": self.kind,
            "vote": self.how,
            "judges": [{"name": m.name, **m.judge.describe()} for m in self.members],
        }
        if self.how == "mean_score":
            described["threshold"] = self.threshold
        return described


async def _together(
    members: Sequence[Member],
    items: Sequence[JudgeItem],
    generate: Generate | None,
    scorer: Scorer | None = None,
) -> list[list[Verdict]]:
    """Each of ``members``' verdicts on ``items``, in member order, the members judging at once: two
    llm members' requests reach the worker's batcher together and share its batches (one after the
    other, each member's requests would wait for the last one's). Every member finishes before a
    member's error is raised (none is left running)."""
    found = await asyncio.gather(
        *(m.judge.judge(items, generate, scorer) for m in members), return_exceptions=True
    )
    for verdicts in found:
        if isinstance(verdicts, BaseException):
            raise verdicts
    return cast(list[list[Verdict]], found)


def carried(item: JudgeItem, name: str) -> Verdict:
    """Member ``name``'s verdict on ``item`` as its infer job carried it (in the row, or in the
    item's candidate); a rejection saying so when it is not there."""
    found = candidates.of(item.record)
    source = found[item.candidate] if found is not None and item.candidate < len(found) else item.record
    held = source.get(CARRIED)
    v = held.get(name) if isinstance(held, Mapping) else None
    if not isinstance(v, Mapping) or not isinstance(v.get("approved"), bool):
        return Verdict(
            False,
            f"judge_error: no verdict of jury member {name} carried from inference (the infer job judged "
            "it where the answer was generated: infer again with the run's settings)",
        )
    return Verdict(v["approved"], str(v.get("reason", "")), number(v.get("score")))


@dataclass(frozen=True)
class JuryStats:
    """A round's jury figures from its tally: the answers ``voted`` on, those on which the
    members ``split`` (did not all agree), and each member's approved and rejected answers."""

    voted: int
    split: int
    members: dict[str, dict[str, int]]

    def as_json(self) -> dict[str, Any]:
        return {
            "voted": self.voted,
            "split": self.split,
            "disagreement_rate": round(self.split / self.voted, 4) if self.voted else 0.0,
            "members": {
                name: {**c, "approval_rate": round(c["approved"] / max(1, c["approved"] + c["rejected"]), 4)}
                for name, c in self.members.items()
            },
        }
