"""The judge interface: records and their model outputs in, one verdict each out."""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from airflow_batchinfer.engines.base import GenerationRequest, GenerationResult

Generate = Callable[[list[GenerationRequest]], Awaitable[list[GenerationResult]]]
"""Runs requests through the worker's shared batcher (for judges that call a model)."""


@dataclass(frozen=True)
class Verdict:
    approved: bool
    reason: str = ""
    score: float | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"approved": self.approved, "reason": self.reason}
        if self.score is not None:
            out["score"] = self.score
        return out


@dataclass(frozen=True)
class JudgeItem:
    record: Mapping[str, Any]
    result: str
    record_id: str
    attempt: int = 1
    candidate: int = 0  # which of the record's candidates ``result`` is (judges.candidates)


class Judge(abc.ABC):
    """Decides approved/rejected for records whose inference succeeded."""

    kind: ClassVar[str] = "judge"

    @abc.abstractmethod
    async def judge(self, items: Sequence[JudgeItem], generate: Generate | None = None) -> list[Verdict]:
        """One verdict per item, in order. Never raises for one bad item: it becomes a rejection."""

    def describe(self) -> dict[str, Any]:
        """What identifies this judge's decisions (goes into job fingerprints)."""
        return {"type": self.kind}
