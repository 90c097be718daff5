"""How a round's judge agreed with the people who reviewed it: ``round-NN/review/calibration.json``
(:class:`Calibration`), written when the reviewers' decisions on round NN take effect (the next
gate's answer, :mod:`airflow_batchinfer.review.apply`), computed by
:func:`airflow_batchinfer.review.calibration.calibrate`. The report, the next gates' bodies and the
review desk read it; the desk computes the same figures live while people decide."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from airflow_batchinfer.state.docs.io import DocModel, read_model
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage.json_doc import write_bytes
from airflow_batchinfer.storage.location import StorageOptions, join, resolve


class Confusion(BaseModel):
    """The reviewed rows by the judge's verdict and the person's (raw counts, not weighted)."""

    model_config = ConfigDict(extra="forbid")
    both_approve: int = 0
    judge_approves_person_rejects: int = 0
    judge_rejects_person_approves: int = 0
    both_reject: int = 0


class Bucket(BaseModel):
    """One score bucket (``bucket``: its lower edge, ``0.0`` … ``0.9``, or ``none``): the judged
    rows in it (``rows``, when counted), the share the judge approved, the rows people reviewed, the
    share they approved and how often they agreed with the judge (both weighted per stratum)."""

    model_config = ConfigDict(extra="forbid")
    bucket: str
    rows: int | None = None
    judge_approval: float | None = None
    reviewed: int = 0
    person_approval: float | None = None
    agreement: float | None = None


class Calibration(DocModel):
    """The judge against the people who reviewed round ``round``.

    ``reviewed``: the rows a person's own decision (one naming its id) settled, of which
    ``spot_checks`` were spot checks; ``bulk``: rows a decision by filter settled, left out (a rule
    over a group is not a person's look at each row; ``None`` where not counted, the desk's live
    figures); ``unjudged``: decided rows the judge never judged (an inference error, a truncated
    answer, a human judge's). ``confusion``: the reviewed rows by the two verdicts. ``agreement``,
    ``kappa`` (Cohen's κ), ``precision`` and ``recall`` of "approve", the person taken as truth: with
    ``weighted``, each reviewed row counts for the judged rows of its stratum (the judge's verdict
    and score bucket) that it stands for, so they estimate the round's judged rows, ``coverage`` of
    them in strata with a reviewed row; without, over the reviewed rows as they are. ``None`` where
    undefined, ``notes`` saying why. ``buckets``: the same per score bucket."""

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset()

    round: int
    decisions: int = 0
    reviewed: int = 0
    spot_checks: int = 0
    bulk: int | None = None
    unjudged: int = 0
    weighted: bool = False
    coverage: float | None = None
    confusion: Confusion = Field(default_factory=Confusion)
    agreement: float | None = None
    kappa: float | None = None
    precision: float | None = None
    recall: float | None = None
    notes: list[str] = Field(default_factory=list)
    buckets: list[Bucket] = Field(default_factory=list)


_CALIBRATION = TypeAdapter(Calibration)


def calibration_uri(layout: RunLayout, r: int) -> str:
    return join(layout.review(r), "calibration.json")


def read_calibration(layout: RunLayout, r: int, so: StorageOptions | None = None) -> Calibration | None:
    """Round ``r``'s calibration, or ``None`` before its decisions took effect (or without any)."""
    return read_model(_CALIBRATION, calibration_uri(layout, r), "judge calibration", so)


def write_calibration(layout: RunLayout, doc: Calibration, so: StorageOptions | None = None) -> None:
    write_bytes(resolve(calibration_uri(layout, doc.round), so), doc.encode())
