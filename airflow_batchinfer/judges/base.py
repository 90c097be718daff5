"""The judge interface: records and their model outputs in, one verdict each out."""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_batchinfer.engines.base import GenerationRequest, GenerationResult
from airflow_batchinfer.engines.scoring import ScoreRequest, ScoreResult, ScoringModel
from airflow_batchinfer.engines.tools import ToolCall

if TYPE_CHECKING:
    from airflow_batchinfer.prompts.build import PromptBuilder

Generate = Callable[[list[GenerationRequest]], Awaitable[list[GenerationResult]]]
"""Runs requests through the worker's shared batcher (for judges that call a model)."""


@dataclass(frozen=True)
class Scorer:
    """The scoring model a worker serves (``reward`` and ``classifier`` judges), and how to score
    requests with it through the worker's shared batcher; ``prompts``: how the job renders a record's
    prompt (the run's ``prompt_template`` and ``system``, a retry's ``retry_template`` and
    ``retry_system``), the conversation a model judge scores with the answer (``None``: records are
    OpenAI batch requests, rendered from their body)."""

    model: ScoringModel
    score: Callable[[list[ScoreRequest]], Awaitable[list[ScoreResult]]]
    prompts: PromptBuilder | None = None


@dataclass(frozen=True)
class Verdict:
    approved: bool
    reason: str = ""
    score: float | None = None
    # a jury's: each member's verdict ({name, type, approved, reason, score?}), in the jury's order
    members: tuple[Mapping[str, Any], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"approved": self.approved, "reason": self.reason}
        if self.score is not None:
            out["score"] = self.score
        if self.members:
            out["members"] = [dict(m) for m in self.members]
        return out


@dataclass(frozen=True)
class JudgeItem:
    record: Mapping[str, Any]
    result: str
    record_id: str
    attempt: int = 1
    candidate: int = 0  # which of the record's candidates ``result`` is (judges.candidates)
    tool_calls: tuple[ToolCall, ...] | None = None  # the calls that answer made (engines.tools)


class Judge(abc.ABC):
    """Decides approved/rejected for records whose inference succeeded."""

    kind: ClassVar[str] = "judge"

    @abc.abstractmethod
    async def judge(
        self, items: Sequence[JudgeItem], generate: Generate | None = None, scorer: Scorer | None = None
    ) -> list[Verdict]:
        """One verdict per item, in order. Never raises for one bad item: it becomes a rejection.
        ``generate``: the worker's generating model; ``scorer``: its scoring model (a worker serves
        one or the other)."""

    def serving_refusal(self, scoring: ScoringModel | None) -> str | None:
        """Why a worker serving ``scoring`` (``None``: a generating model) cannot run this judge;
        ``None``: it can. A job is refused at submit with it, before any record is judged."""
        return None

    def describe(self) -> dict[str, Any]:
        """What identifies this judge's decisions (goes into job fingerprints)."""
        return {"type": self.kind}
