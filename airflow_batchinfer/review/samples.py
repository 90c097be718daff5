"""One rejected row as the review desk shows it (:class:`Sample`), cut to the desk's bounds, and the
one filter rule of pages, searches and bulk decisions (:func:`matches`)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from airflow_batchinfer.exceptions import ReviewError
from airflow_batchinfer.judges.candidates import GENERATION_FIELDS
from airflow_batchinfer.judges.reasons import reason_group, row_reason, text_of
from airflow_batchinfer.judges.spot_check import is_spot_check
from airflow_batchinfer.prompts.retries import PREVIOUS, SENT_BACK
from airflow_batchinfer.review.bounds import Bounds, clip, json_text, utf8_size
from airflow_batchinfer.review.prompt_text import Prompts, render
from airflow_batchinfer.values import number
from airflow_batchinfer.worker.jobs import columns

__all__ = ["FIELDS", "OUTPUT_FIELDS", "Sample", "field_value", "matches", "sample_of"]

# Fields a job adds to an input record (the rest of a row is the record as the round read it).
OUTPUT_FIELDS = (
    frozenset({"result", "status", "error", "attempts", "round", "accepted_by_review"})
    | {"finish_reason", "max_tokens"}  # how the generation ended, and its budget (judges.truncation)
    | GENERATION_FIELDS  # its verdict, candidates and logprobs (judges.candidates)
)
_MEMBER_REASON = re.compile(r"members\.(\d{1,3})\.reason")


@dataclass(frozen=True)
class Sample:
    """One rejected row as the review page shows it.

    ``position`` is the row's index within its shard's rejected file; ``prompt`` is rendered from the
    row's input fields with the run's ``prompt_template`` and ``system`` as the worker renders it
    (``None`` when it cannot be); ``output`` is the row's ``result``; ``group`` the reason's
    :func:`~airflow_batchinfer.judges.reasons.reason_group`; ``record`` the input fields (the row
    without ``result``, ``status``, ``error``, ``judgment``, ``attempts`` and ``round``).

    ``members``: a jury's verdict's members (``judgment.members``: each one's ``name``, ``type``,
    ``approved``, ``reason`` and ``score``), in the jury's order; ``sent_back``: the retry decision
    that sent the attempt back to the next round (``by``, ``at``, ``note``, ``round``: a pending row's
    own, or what the attempts lookup finds in the round's decisions).

    ``truncated`` names what :meth:`bounded` cut short, each with its whole size in UTF-8 bytes: a
    text of :data:`FIELDS` (its start kept), ``members.<i>.reason`` (a jury member's reason),
    ``record.<key>`` (one record field: the start of its JSON text kept, as a string) or ``record``
    (the record's later fields left out; its whole JSON's size). Empty: the sample is whole.
    ``reasoning``: a reasoning model's reasoning (the row's; ``output`` is the answer only);
    ``tool_calls``: the answer's tool calls as pretty JSON, a text of :data:`FIELDS` cut like the others.
    :func:`field_value` reads one of them whole."""

    id: str
    shard_id: str
    position: int
    round: int
    attempts: int
    prompt: str | None
    output: str | None
    approved: bool
    reason: str
    score: float | None
    group: str
    record: dict[str, Any]
    status: str = "rejected"
    error: str | None = None
    truncated: Mapping[str, int] = field(default_factory=dict)
    # the judge's own verdict on a row held for people (review_below_score, a spot check), else None;
    # whether it awaits people (``judgment.for_review``), and whether it is a spot check of an approval
    judge_approved: bool | None = None
    for_review: bool = False
    spot_check: bool = False
    # what the attempt's prompt was told of the one before (the row's ``previous``): its prompt
    # renders from it; not shown apart (the earlier attempt is a row of its own)
    previous: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)
    members: tuple[Mapping[str, Any], ...] = ()
    sent_back: Mapping[str, Any] | None = None
    # a reasoning model's reasoning before its answer (``None``: none parsed); shown apart from the
    # output, which is the answer only
    reasoning: str | None = None
    # the answer's tool calls (the row's ``tool_calls``, OpenAI's list) as pretty JSON; ``None``: none
    tool_calls: str | None = None

    def bounded(self, bounds: Bounds) -> Sample:
        """This sample as the desk shows it: each text of :data:`FIELDS`, each jury member's reason
        and each record field cut to ``bounds.field_bytes``, the record to ``bounds.record_bytes``,
        what was cut in ``truncated``."""
        cut: dict[str, int] = {}
        texts: dict[str, str | None] = {}
        for name in FIELDS:
            value = getattr(self, name)
            texts[name] = value if value is None else _clip_into(cut, name, value, bounds.field_bytes)
        members = tuple(
            {**m, "reason": _clip_into(cut, f"members.{i}.reason", m["reason"], bounds.field_bytes)}
            for i, m in enumerate(self.members)
        )
        record = _bounded_record(self.record, bounds, cut)
        if not cut:
            return self
        return replace(self, **texts, members=members, record=record, truncated=cut)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "shard_id": self.shard_id,
            "position": self.position,
            "round": self.round,
            "attempts": self.attempts,
            "prompt": self.prompt,
            "output": self.output,
            "approved": self.approved,
            "reason": self.reason,
            "score": self.score,
            "group": self.group,
            "record": dict(self.record),
            "status": self.status,
            "error": self.error,
            "truncated": dict(self.truncated),
            "judge_approved": self.judge_approved,
            "for_review": self.for_review,
            "spot_check": self.spot_check,
            "members": [dict(m) for m in self.members],
            "sent_back": None if self.sent_back is None else dict(self.sent_back),
            "reasoning": self.reasoning,
            "tool_calls": self.tool_calls,
        }


# A sample's texts the desk cuts to ``field_bytes`` (and reads whole through field_value).
FIELDS = ("id", "prompt", "output", "reason", "error", "status", "reasoning", "tool_calls")


def _clip_into(cut: dict[str, int], path: str, text: str, limit: int) -> str:
    head, whole = clip(text, limit)
    if whole is not None:
        cut[path] = whole
    return head


def _bounded_record(record: Mapping[str, Any], bounds: Bounds, cut: dict[str, int]) -> dict[str, Any]:
    """The record's fields in order, each cut to ``field_bytes`` (a value that is not text: as the
    start of its JSON text), until ``record_bytes`` are shown; then ``cut["record"]``."""
    out: dict[str, Any] = {}
    used = 0
    for key, value in record.items():
        whole: int | None = None
        shown: Any
        if isinstance(value, str):
            shown, whole = clip(value, bounds.field_bytes)
            text = shown
        elif isinstance(value, dict | list):
            text, whole = clip(json_text(value), bounds.field_bytes)
            shown = value if whole is None else text
        else:  # a number, a boolean, null
            shown, text = value, json_text(value)
        used += utf8_size(key) + utf8_size(text)
        if utf8_size(key) > bounds.field_bytes or used > bounds.record_bytes:
            cut["record"] = utf8_size(json_text(dict(record)))  # this field and the rest left out
            break
        out[key] = shown
        if whole is not None:
            cut[f"record.{key}"] = whole
    return out


def matches(sample: Sample, group: str | None = None, text: str | None = None) -> bool:
    """Whether ``sample`` is selected by a filter: ``group`` equals its reason group (when given), and
    ``text`` (when given, not blank) is a case-insensitive substring of its id, prompt, output or
    reason. The one rule for pages, searches and bulk decisions."""
    if group is not None and sample.group != group:
        return False
    needle = (text or "").strip().casefold()
    if not needle:
        return True
    return any(needle in f.casefold() for f in (sample.id, sample.prompt, sample.output, sample.reason) if f)


def field_value(sample: Sample, path: str) -> Any:
    """One value of a whole sample, by a path of its ``truncated`` (a text of :data:`FIELDS`,
    ``record`` or ``record.<key>``: the record field named by the rest of the path, dots and all)."""
    if path in FIELDS:
        return getattr(sample, path)
    if (m := _MEMBER_REASON.fullmatch(path)) and int(m[1]) < len(sample.members):
        return sample.members[int(m[1])]["reason"]
    if path == "record":
        return dict(sample.record)
    key = path.removeprefix("record.")
    if key != path and key in sample.record:
        return sample.record[key]
    raise ReviewError(
        f"sample {sample.id[:200]!r} has no field {path[:200]!r}: name one of {', '.join(FIELDS)}, "
        "members.<i>.reason, record or record.<key> (the paths its truncated map names)"
    )


def sample_of(
    row: Mapping[str, Any],
    shard_id: str,
    position: int,
    *,
    round: int,
    id_field: str,
    prompts: Prompts | None,
) -> Sample:
    """A row of a run (any round's rejected or pending row) as a :class:`Sample`: ``round`` when the
    row names none, ``prompts`` renders its prompt (``None``: no prompt)."""
    judgment = row.get("judgment")
    judgment = judgment if isinstance(judgment, dict) else {}
    reason = row_reason(row)
    score = judgment.get("score")
    # a row refused for its input columns (worker.jobs.columns) holds the record's own of those names
    refused = str(row.get("error") or "").startswith(columns.CLASH)
    hidden = OUTPUT_FIELDS - columns.ANSWER_FIELDS if refused else OUTPUT_FIELDS
    record = {k: v for k, v in row.items() if k not in hidden}
    rid = text_of(row.get(id_field))
    attempts = _int(row.get("attempts"), 0)
    error = row.get("error")
    output = row.get("result")
    previous = row.get(PREVIOUS)
    previous = previous if isinstance(previous, dict) else None
    return Sample(
        id=rid,
        shard_id=shard_id,
        position=position,
        round=_int(row.get("round"), round),
        attempts=attempts,
        prompt=render(prompts, record, rid, attempts, previous),
        output=None if output is None else text_of(output),
        approved=bool(judgment.get("approved", False)),
        reason=reason,
        score=number(score),
        group=reason_group(reason),
        record=record,
        status=text_of(row.get("status")) or "rejected",
        error=None if error is None else text_of(error),
        judge_approved=judge_approved
        if isinstance(judge_approved := judgment.get("judge_approved"), bool)
        else None,
        for_review=judgment.get("for_review") is True,
        spot_check=is_spot_check(judgment),
        previous=previous,
        members=_members(judgment.get("members")),
        sent_back=sent_back if isinstance(sent_back := row.get(SENT_BACK), dict) else None,
        reasoning=reasoning if isinstance(reasoning := row.get("reasoning"), str) and not refused else None,
        tool_calls=json.dumps(calls, indent=2, ensure_ascii=False)
        if isinstance(calls := row.get("tool_calls"), list) and calls and not refused
        else None,
    )


def _members(value: Any) -> tuple[dict[str, Any], ...]:
    """A jury verdict's ``members`` as the desk shows them: each one's name, type, verdict, reason and
    score (whatever else a member holds left out; a member that is not an object skipped)."""
    if not isinstance(value, list):
        return ()
    out = []
    for m in value:
        if not isinstance(m, dict):
            continue
        out.append(
            {
                "name": text_of(m.get("name")),
                "type": text_of(m.get("type")),
                "approved": m["approved"] if isinstance(m.get("approved"), bool) else None,
                "reason": text_of(m.get("reason")),
                "score": number(m.get("score")),
            }
        )
    return tuple(out)


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default
