"""The review desk: a round's rejected samples for the people at the review gate between rounds.

Pure Python over the package's storage layer (local paths and ``s3://`` alike), no Airflow. The
judges' reason groups it shows are :mod:`airflow_batchinfer.judges.reasons` (the workers count them):

* :mod:`~airflow_batchinfer.review.browse`: :class:`RoundView` pages, filters, samples and finds a
  round's rejected rows straight from its shards (:mod:`~airflow_batchinfer.review.round_files`),
  without loading the round; each one a :class:`Sample` (:mod:`~airflow_batchinfer.review.samples`)
  with its prompt as sent (:mod:`~airflow_batchinfer.review.prompt_text`);
* :mod:`~airflow_batchinfer.review.trends`: the run's rounds so far, and their plot;
* :mod:`~airflow_batchinfer.review.decisions`: reviewers' decisions (accept, retry, drop) per
  sample or in bulk, stored in ``round-NN/review/decisions.jsonl``;
* :mod:`~airflow_batchinfer.review.app` and :mod:`~airflow_batchinfer.review.routes`: the desk's web
  app, whose Airflow side (login, permissions, the gates) the plugin supplies
  (:mod:`airflow_batchinfer.plugin.desk`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_batchinfer.lazy import exports

if TYPE_CHECKING:
    from airflow_batchinfer.review.browse import Page, RoundView
    from airflow_batchinfer.review.decisions import (
        ACTIONS,
        Action,
        Decision,
        DecisionLog,
        Resolver,
        resolve,
        tally,
    )
    from airflow_batchinfer.review.round_files import ShardRows
    from airflow_batchinfer.review.samples import Sample, matches
    from airflow_batchinfer.review.trends import trend

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
        "browse": ("Page", "RoundView"),
        "decisions": ("ACTIONS", "Action", "Decision", "DecisionLog", "Resolver", "resolve", "tally"),
        "round_files": ("ShardRows",),
        "samples": ("Sample", "matches"),
        "trends": ("trend",),
    },
)
