"""Reason groups: a judge's reasons normalised so that reasons differing only in their numbers, quoted
values or spacing count as one group ("expected 14, got 5" and "expected 8, got 3" are both
``expected #, got #``).

A worker counts the groups of the rows it rejects into its completion manifest (``reason_groups``,
capped at :data:`MAX_GROUPS`), so the review page shows a round's groups from the manifests, in
O(shards), without reading a row.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from airflow_batchinfer.judges.spot_check import SPOT_CHECK

__all__ = [
    "MAX_GROUPS",
    "MAX_KEY_CHARS",
    "NO_REASON",
    "OTHER",
    "TRUNCATED",
    "TRUNCATED_IN_THINKING",
    "ReasonGroups",
    "reason_group",
    "row_reason",
    "text_of",
]

MAX_GROUPS = 64  # groups a manifest (or a round's view) keeps; the rest add up under OTHER
MAX_KEY_CHARS = 120  # a group key's length at most (longer ones end with "…")
NO_REASON = "(no reason)"
OTHER = "(other)"
# Distinct groups one counter holds before it folds its smallest half into OTHER (bounded memory for
# a judge whose free-form reasons are all different).
MAX_TRACKED = 20_000
INFERENCE_ERROR = "inference_error:"
# The group of a truncated row's rejection (judges.truncation: "truncated: …"), whatever its numbers.
TRUNCATED = "truncated"
# The group of a row cut while still thinking ("truncated_in_thinking: …"): no answer at all, apart
# from an answer cut short (a larger thinking budget, or a lower reasoning effort, is the remedy).
TRUNCATED_IN_THINKING = "truncated_in_thinking"

_QUOTED = re.compile(
    r'"(?:[^"\\\n]|\\.)*"'  # "double"
    r"|(?<!\w)'[^'\n]*'(?!\w)"  # 'single' (an apostrophe inside a word is no quote)
    r"|`[^`\n]*`"  # `code`
    r"|“[^”\n]*”|‘[^’\n]*’"  # typographic
)
# UUIDs, hex runs of 8+ characters with a digit and a letter (request ids, hashes), 0x literals.
_HEX = re.compile(
    r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
    r"|\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b"
    r"|\b0x[0-9a-fA-F]+\b"
)
# Numbers in two cheap passes (a pattern that starts with a digit is scanned for fast): the digits
# (1,234  12  3.5  1e-5), then a sign or a leading dot not after a word or a number ("x -4", ".5"; not
# the "-" of "3-5").
_DIGITS = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?")
_SIGNED = re.compile(r"(?<![\w.#])[-+]#|(?<![\w#])\.#")


@functools.lru_cache(maxsize=65_536)
def reason_group(reason: str) -> str:
    """The group key of a judge's reason: quoted strings become ``"…"``, numbers ``#`` (integers,
    decimals, negatives, ``1,234``, ``1e-5``; hex ids and UUIDs too), whitespace runs one space, case
    kept, at most :data:`MAX_KEY_CHARS` characters; an empty reason is ``(no reason)``. An inference
    error (``inference_error: <message>``) keeps its prefix and normalises its message the same way;
    a truncated row's rejection (``truncated: …``) is the group ``truncated``, one cut while still
    thinking (``truncated_in_thinking: …``) the group ``truncated_in_thinking``, and a spot check's
    (``spot check: <the judge's reason>``, :mod:`~airflow_batchinfer.judges.spot_check`) the group
    ``spot check``."""
    text = str(reason or "")
    if text.startswith(TRUNCATED + ":"):
        return TRUNCATED
    if text.startswith(TRUNCATED_IN_THINKING + ":"):
        return TRUNCATED_IN_THINKING
    if text == SPOT_CHECK or text.startswith(SPOT_CHECK + ":"):
        return SPOT_CHECK
    if text.startswith(INFERENCE_ERROR):
        return _cut(INFERENCE_ERROR + " " + _normalise(text[len(INFERENCE_ERROR) :]))
    return _cut(_normalise(text)) or NO_REASON


def _normalise(text: str) -> str:
    text = _QUOTED.sub('"…"', text)
    text = _HEX.sub("#", text)
    text = _DIGITS.sub("#", text)
    if "-#" in text or "+#" in text or ".#" in text:
        text = _SIGNED.sub("#", text)
    return " ".join(text.split())


def _cut(key: str) -> str:
    key = key.strip()
    if len(key) <= MAX_KEY_CHARS:
        return key
    return key[: MAX_KEY_CHARS - 1].rstrip() + "…"


def text_of(value: Any) -> str:
    """A row's value as the desk shows it: strings as they are, numbers as written, other JSON
    compact ("" for none)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float | bool):
        return str(value)
    return orjson.dumps(value).decode()


def row_reason(row: Mapping[str, Any]) -> str:
    """The judge's reason of a judged row: what the worker counts into a manifest's reason groups
    and the desk groups, filters and shows, so the two always agree."""
    judgment = row.get("judgment")
    return text_of(judgment.get("reason")) if isinstance(judgment, dict) else ""


def ranked(counts: Mapping[str, int]) -> list[tuple[str, int]]:
    """``counts`` most common first, ties by key (deterministic)."""
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


class ReasonGroups:
    """Counts of reason groups. :meth:`add` costs one cached normalisation and one dict increment;
    :meth:`as_dict` keeps the :data:`MAX_GROUPS` most common and adds up the rest under ``(other)``
    (so a manifest stays small). Memory is bounded: past :data:`MAX_TRACKED` distinct groups the
    least common half is folded into ``(other)`` (exact for any judge with fewer distinct groups)."""

    def __init__(self, counts: Mapping[str, int] | None = None) -> None:
        self.counts: dict[str, int] = {}
        self.other = 0
        if counts:
            self.merge(counts)

    def add(self, reason: str | None, n: int = 1) -> None:
        """Count ``n`` rows rejected for ``reason`` (a raw judge reason)."""
        self.add_group(reason_group(reason or ""), n)

    def add_group(self, group: str, n: int = 1) -> None:
        """Count ``n`` rows of an already normalised ``group``."""
        if group == OTHER:
            self.other += n
            return
        counts = self.counts
        counts[group] = counts.get(group, 0) + n
        if len(counts) > MAX_TRACKED:
            self._fold()

    def merge(self, other: Mapping[str, int] | ReasonGroups) -> ReasonGroups:
        """Add another counter, or a ``{group: n}`` dict (a manifest's ``reason_groups``)."""
        items: Iterable[tuple[str, int]]
        if isinstance(other, ReasonGroups):
            items = [*other.counts.items(), (OTHER, other.other)]
        else:
            items = other.items()
        for group, n in items:
            if n:
                self.add_group(str(group), int(n))
        return self

    def total(self) -> int:
        return sum(self.counts.values()) + self.other

    def __len__(self) -> int:
        return len(self.counts) + (1 if self.other else 0)

    def __bool__(self) -> bool:
        return bool(self.counts) or bool(self.other)

    def as_dict(self, limit: int = MAX_GROUPS) -> dict[str, int]:
        """The ``limit`` most common groups (count descending, then key), then ``(other)`` with the
        rest, when there is any."""
        top = ranked(self.counts)
        out = dict(top[:limit])
        rest = self.other + sum(n for _, n in top[limit:])
        if rest:
            out[OTHER] = rest
        return out

    def _fold(self) -> None:
        keep = ranked(self.counts)[: MAX_TRACKED // 2]
        self.other += self.total() - self.other - sum(n for _, n in keep)
        self.counts = dict(keep)
