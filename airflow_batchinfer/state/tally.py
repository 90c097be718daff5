"""What a job counted: the typed :class:`Tally` a shard job's completion manifest (``counts``) and its
status on the wire carry, that close's accepted doc copies and a round's close adds up.

One sub-model per feature, each counted where that feature works (the worker's job modules) and read
by field where it is reported (the round's close, its summary and report):

- :class:`Read`: a round-0 range job's lines as read (:class:`~airflow_batchinfer.storage.reader.ReadStats`);
- :class:`Generated`: the records an inference answered (``ok``) or not (``error``);
- :class:`Outcomes`: the rows by outcome (judged, in place: retried until approved or exhausted);
- ``truncated``: the rows (in place: attempts) whose completion was cut at ``max_tokens``;
  ``truncated_in_thinking``: those of them cut while the model was still thinking (no answer at all);
- ``adapters``: per LoRA adapter, its judged rows (:class:`AdapterTally`);
- ``strata``: per stratum and score bucket, the rows a judge people check judged
  (:mod:`~airflow_batchinfer.judges.spot_check`, the calibration's weights);
- :class:`JuryTally`: how often a jury's members agreed, and each member's approvals;
- :class:`CandidateTally`: approval per candidate index and per record (pass@k);
- :class:`Resume`: what a job took from an earlier attempt (segments, checkpoints);
- ``repeated_ids``: the rows a round-0 close left out as repeats of an earlier range's ids.

Every field is a count or a map of counts, so tallies add up (``a + b``, ``sum(tallies, Tally())``)
over chunks, jobs and shards. A job counts into its tallies in place (a chunk's, then the job's);
``+`` makes a new one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from airflow_batchinfer.judges import candidates, jury, spot_check
from airflow_batchinfer.judges.base import Verdict
from airflow_batchinfer.judges.truncation import LENGTH, TRUNCATED_IN_THINKING
from airflow_batchinfer.storage.reader import ReadStats

__all__ = [
    "AdapterTally",
    "CandidateTally",
    "Generated",
    "JuryTally",
    "MemberTally",
    "Outcomes",
    "Read",
    "Resume",
    "Tally",
]


def _combine(a: Any, b: Any, sign: int) -> Any:
    """``a + b`` (``sign`` 1) or ``a - b`` floored at 0 (``sign`` -1), field by field: counts, maps
    of counts (a key one lacks counts as 0) and parts (``None``, an absent one, counts as empty)."""
    if b is None:
        return _copy(a)
    if a is None:
        return _copy(b) if sign > 0 else None
    if isinstance(a, _Part):
        fields = type(a).model_fields
        return type(a).model_construct(**{k: _combine(getattr(a, k), getattr(b, k), sign) for k in fields})
    if isinstance(a, dict):
        out = _copy(a)
        for k, v in b.items():
            if k in out or sign > 0:
                out[k] = _combine(out.get(k), v, sign)
        return out
    return a + b if sign > 0 else max(0, a - b)


def _copy(v: Any) -> Any:
    if isinstance(v, BaseModel):
        return v.model_copy(deep=True)
    return {k: _copy(x) for k, x in v.items()} if isinstance(v, dict) else v


class _Part(BaseModel):
    """A part of a tally: counts (or maps of them) that add up field by field. Stored without what
    is empty (a count of 0, an empty map or part; but a part whose absence means something, ``None``
    by default, is kept when present), which reads back as it was."""

    model_config = ConfigDict(extra="forbid")

    @model_serializer(mode="wrap")
    def _without_empty(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        fields = type(self).model_fields
        return {
            k: v for k, v in data.items() if v is not None and (v not in (0, {}) or fields[k].default is None)
        }

    def __add__(self, other: Self) -> Self:
        out: Self = _combine(self, other, 1)
        return out

    def __sub__(self, other: Self) -> Self:
        """Less ``other``'s counts, none below 0 (what close leaves out of a job's rows)."""
        out: Self = _combine(self, other, -1)
        return out

    def __radd__(self, other: object) -> Self:
        if other == 0:  # sum() starts at 0
            return self.model_copy(deep=True)
        return NotImplemented


class Read(_Part):
    """A round-0 range job's read of its range: every line as ``records``, ``blank``, ``skipped`` or
    ``quarantined`` (round 0's close numbers the run's ``rejects/`` from these)."""

    lines: int = 0
    records: int = 0
    blank: int = 0
    skipped: int = 0
    quarantined: int = 0

    @classmethod
    def of(cls, stats: ReadStats) -> Read:
        return cls(**stats.as_dict())


class Generated(_Part):
    """Records an inference answered (``ok``) or could not (``error``: the engine's, or a prompt's)."""

    ok: int = 0
    error: int = 0


class Outcomes(_Part):
    """The rows by outcome. Judged: ``approved`` or ``rejected``; of the rejected, ``inference_errors``
    (nothing to judge) and ``for_review`` (held for people), of those ``spot_checks`` (approved by
    the judge). In place: ``approved``, ``max_attempts`` (exhausted) or ``error`` (its prompt could
    not be built), after ``attempts`` in all."""

    approved: int = 0
    rejected: int = 0
    inference_errors: int = 0
    for_review: int = 0
    spot_checks: int = 0
    max_attempts: int = 0
    error: int = 0
    attempts: int = 0


class AdapterTally(_Part):
    """One LoRA adapter's judged rows: ``approved``, ``rejected`` (in place: exhausted), and
    ``spot_checks``, approved by the judge but held for people (neither of the others)."""

    approved: int = 0
    rejected: int = 0
    spot_checks: int = 0


class MemberTally(_Part):
    """One jury member's answers: approved and rejected by it."""

    approved: int = 0
    rejected: int = 0


class JuryTally(_Part):
    """A jury's answers: ``voted`` on, ``split`` (its members did not all agree), per member."""

    voted: int = 0
    split: int = 0
    members: dict[str, MemberTally] = Field(default_factory=dict)

    def count(self, verdict: Verdict) -> None:
        """One answer's jury verdict (none for a verdict without members)."""
        members: Sequence[Mapping[str, Any]] = verdict.members or ()
        if not members:
            return
        self.voted += 1
        if len({bool(m.get("approved")) for m in members}) > 1:
            self.split += 1
        for m in members:
            mine = self.members.setdefault(str(m["name"]), MemberTally())
            if m.get("approved"):
                mine.approved += 1
            else:
                mine.rejected += 1

    def stats(self) -> jury.JuryStats | None:
        """The round's jury figures (``None``: no jury voted)."""
        if not self.voted:
            return None
        members = {n: {"approved": m.approved, "rejected": m.rejected} for n, m in self.members.items()}
        return jury.JuryStats(self.voted, self.split, members)


class CandidateTally(_Part):
    """Records judged with several candidates: per candidate index, those whose candidate was
    approved (``by_index``); per ``n`` candidates, the records with ``c`` of them approved
    (``by_record[n][c]``)."""

    by_index: dict[int, int] = Field(default_factory=dict)
    by_record: dict[int, dict[int, int]] = Field(default_factory=dict)

    def count(self, n: int, selection: candidates.Selection) -> None:
        """One judged record of ``n`` candidates, as ``selection`` found them."""
        for i in selection.approved:
            self.by_index[i] = self.by_index.get(i, 0) + 1
        mine = self.by_record.setdefault(n, {})
        c = len(selection.approved)
        mine[c] = mine.get(c, 0) + 1

    def stats(self) -> candidates.CandidateStats | None:
        """Approval per index and pass@k (``None``: no record had more than one candidate)."""
        by_record = {(c, n): k for n, cs in self.by_record.items() for c, k in cs.items()}
        return candidates.stats(by_record, self.by_index)


class Resume(_Part):
    """What a job took from earlier attempts: ``records`` from committed segments, ``segments``
    committed by this attempt; in place, ``samples`` resumed from checkpoints and the
    ``checkpoint_segments`` written."""

    records: int = 0
    segments: int = 0
    samples: int = 0
    checkpoint_segments: int = 0


class Tally(_Part):
    """What a job (a chunk of it, a round's jobs added up) counted; see the module's docstring."""

    read: Read | None = None  # only a job that read a round-0 range
    generated: Generated = Field(default_factory=Generated)
    outcomes: Outcomes = Field(default_factory=Outcomes)
    truncated: int = 0
    truncated_in_thinking: int = 0
    adapters: dict[str, AdapterTally] = Field(default_factory=dict)
    strata: dict[spot_check.Stratum, dict[str, int]] = Field(default_factory=dict)
    jury: JuryTally = Field(default_factory=JuryTally)
    candidates: CandidateTally = Field(default_factory=CandidateTally)
    resume: Resume = Field(default_factory=Resume)
    repeated_ids: int = 0

    def count_adapter(self, name: str, status: str, spot_checked: bool = False) -> None:
        """A judged row's count under the adapter ``name`` that answered it: a spot check apart."""
        mine = self.adapters.setdefault(name, AdapterTally())
        if spot_checked:
            mine.spot_checks += 1
        elif status == "approved":
            mine.approved += 1
        else:
            mine.rejected += 1

    def count_truncated(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """The generated ``rows`` cut at ``max_tokens``, and apart those cut while thinking."""
        for row in rows:
            if row.get("finish_reason") == LENGTH:
                self.truncated += 1
                self.truncated_in_thinking += row.get(TRUNCATED_IN_THINKING) is True

    def count_stratum(self, stratum: spot_check.Stratum, score: float | None) -> None:
        """A judged row people check, in its stratum and its score's bucket."""
        mine = self.strata.setdefault(stratum, {})
        bucket = spot_check.score_bucket(score)
        mine[bucket] = mine.get(bucket, 0) + 1

    def verdicts(self) -> dict[str, dict[str, int]] | None:
        """The judged rows per stratum and bucket, both in order (``None``: none counted)."""
        found = {s: self.strata[s] for s in spot_check.STRATA if self.strata.get(s)}
        return {s: {b: c[b] for b in spot_check.BUCKETS if b in c} for s, c in found.items()} or None

    def by_outcome(self) -> dict[str, int]:
        """The records by outcome, as a worker's metrics label them (the counts that are not 0)."""
        flat = {
            "ok": self.generated.ok,
            "error": self.generated.error + self.outcomes.error,
            **self.outcomes.model_dump(exclude={"error"}),
            "truncated": self.truncated,
            "truncated_in_thinking": self.truncated_in_thinking,
        }
        return {k: v for k, v in flat.items() if v}
