"""The review desk: a round's rejected samples for the people at the review gate between rounds.

Pure Python over the package's storage layer (local paths and ``s3://`` alike), no Airflow. The
judges' reason groups it shows are :mod:`airflow_batchinfer.judges.reasons` (the workers count them):

* :mod:`~airflow_batchinfer.review.browse`: :class:`RoundView` pages, filters, samples and finds a
  round's rejected rows straight from its shards, without loading the round;
* :mod:`~airflow_batchinfer.review.decisions`: reviewers' decisions (accept, retry, drop) per
  sample or in bulk, stored in ``round-NN/review/decisions.jsonl``.

The Airflow page that shows them lives in the same package (its own modules import Airflow; these
do not).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_batchinfer.lazy import exports

if TYPE_CHECKING:
    from airflow_batchinfer.review.browse import Page, RoundView, Sample, ShardRows, matches, trend
    from airflow_batchinfer.review.decisions import (
        ACTIONS,
        Action,
        Decision,
        DecisionLog,
        Resolver,
        resolve,
        tally,
    )

__all__ = [
    "ACTIONS",
    "Action",
    "Decision",
    "DecisionLog",
    "Page",
    "Resolver",
    "RoundView",
    "Sample",
    "ShardRows",
    "matches",
    "resolve",
    "tally",
    "trend",
]

# Imported on first use: importing one module of the package loads no other.
__getattr__, __dir__ = exports(
    __name__,
    __all__,
    {
        "browse": ("Page", "RoundView", "Sample", "ShardRows", "matches", "trend"),
        "decisions": ("ACTIONS", "Action", "Decision", "DecisionLog", "Resolver", "resolve", "tally"),
    },
)
