"""Spot checks: a seeded sample of the rows a judge approved, held back for people to check
(``spot_check_approved``), and the strata the calibration of the judge against people counts.

Which rows: :func:`selected` is a pure function of a seed and a row's id: each judge job holds back
every approved row whose hash falls below the round's rate (:func:`round_rate`, from the rows the
round plans), so every shard and every score bucket is sampled at that same rate (a stratified
sample with proportional allocation, in expectation), a retried or resumed job picks the same rows,
and nothing depends on the order rows are read in. A held row goes to the rejected set exactly as a
verdict below ``review_below_score`` does: reason ``spot check: <the judge's reason>`` (one reason
group on the desk, :data:`SPOT_CHECK`), ``judgment.for_review``, ``judge_approved: true`` and
``spot_check: true``; a row no person decides follows the judge into results when the gate is
answered (:mod:`airflow_batchinfer.review.apply`).

What is counted: a judge job that people check (spot checks or ``review_below_score``) counts its
judged rows per stratum (:meth:`~airflow_batchinfer.state.tally.Tally.count_stratum`): the judge's
verdict as it reached people or results (``approved``: into results, spot checks included;
``held``: approved but held for review by its score; ``rejected``) and the score's bucket
(:func:`score_bucket`; :data:`NO_SCORE` for a judge whose scores are not in [0, 1], a ``reward``
judge's raw ones). The calibration weighs each reviewed row by its stratum's count
(:mod:`airflow_batchinfer.review.calibration`).

Worker side: no Airflow, nothing heavy.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from airflow_batchinfer.exceptions import ConfigError

__all__ = [
    "BUCKETS",
    "NO_SCORE",
    "SPOT_CHECK",
    "STRATA",
    "SpotCheck",
    "Stratum",
    "is_spot_check",
    "round_rate",
    "score_bucket",
    "selected",
    "spot_check_reason",
]

SPOT_CHECK = "spot check"  # the reason group of every spot-check row (judges.reasons)
NO_SCORE = "none"  # the bucket of a verdict without a score
# Score buckets: [0, 0.1), [0.1, 0.2), …, [0.9, 1.0]; named by their lower edge; then unscored.
BUCKETS: tuple[str, ...] = (*(f"{b / 10:.1f}" for b in range(10)), NO_SCORE)
Stratum = Literal["approved", "held", "rejected"]
STRATA: tuple[Stratum, ...] = ("approved", "held", "rejected")
RATE_DIGITS = 6  # significant digits of a round's rate as job params carry it (a stable fingerprint)


def score_bucket(score: float | None) -> str:
    """The bucket of a judge's score: its tenth of [0, 1] (a score outside is clamped to the edge
    bucket; 1.0 is in the last one), or :data:`NO_SCORE`."""
    if score is None or isinstance(score, bool) or not isinstance(score, int | float) or math.isnan(score):
        return NO_SCORE
    return BUCKETS[min(9, max(0, math.floor(float(score) * 10)))]


def selected(row_id: str, *, rate: float, seed: str) -> bool:
    """Whether the row ``row_id`` is in the sample drawn at ``rate`` with ``seed``: its SHA-256 hash,
    as a number in [0, 1), is below ``rate``. Pure: the same id, rate and seed always answer the same,
    whatever shard, chunk or order the row comes in."""
    if rate <= 0:
        return False
    if rate >= 1:
        return True
    h = hashlib.sha256(f"{seed}\0{row_id}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64 < rate


def round_rate(wanted: int, records: int) -> float:
    """The rate that holds back about ``wanted`` of a round's approved rows: ``wanted`` over the
    ``records`` it plans (at most 1). The round's approval is not known before it runs, so a round
    that approves a share ``a`` of its rows holds back about ``a × wanted`` of them."""
    if wanted <= 0 or records <= 0:
        return 0.0
    # significant digits, not decimals: 20 of 100M rows is a rate of 2e-7, not 0
    return float(f"{min(1.0, wanted / records):.{RATE_DIGITS}g}")


@dataclass(frozen=True)
class SpotCheck:
    """A judge job's spot check: the round's ``rate`` and the run's ``seed`` (job params
    ``spot_check: {"rate", "seed"}``)."""

    rate: float
    seed: str

    @classmethod
    def from_params(cls, value: Any) -> SpotCheck:
        if not isinstance(value, Mapping) or set(value) != {"rate", "seed"}:
            raise ConfigError(f'params.spot_check must be {{"rate": 0..1, "seed": "..."}}, got {value!r}')
        rate, seed = value["rate"], value["seed"]
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate <= 1:
            raise ConfigError(f"params.spot_check.rate must be a number in (0, 1], got {rate!r}")
        if not isinstance(seed, str) or not seed:
            raise ConfigError(f"params.spot_check.seed must be a non-empty string, got {seed!r}")
        return cls(float(rate), seed)

    def params(self) -> dict[str, Any]:
        return {"rate": self.rate, "seed": self.seed}

    def holds(self, row_id: str) -> bool:
        return selected(row_id, rate=self.rate, seed=self.seed)


def spot_check_reason(reason: str) -> str:
    """A held row's reason: the judge's, after the spot check's prefix (one reason group)."""
    return f"{SPOT_CHECK}: {reason}" if reason else SPOT_CHECK


def is_spot_check(judgment: Any) -> bool:
    """Whether a row's ``judgment`` is a spot check's (held back although the judge approved it)."""
    return isinstance(judgment, Mapping) and judgment.get("spot_check") is True
