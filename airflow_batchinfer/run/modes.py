"""The choices of a run's ``strategy`` and ``review`` settings: read by :class:`RunConfig
<airflow_batchinfer.run.config.RunConfig>` and by the settings table (:mod:`airflow_batchinfer.settings`),
which the run's config reads its bounds from, so neither imports the other for them."""

from __future__ import annotations

STRATEGIES = ("rounds", "in_place", "hybrid")
REVIEW_MODES = ("never", "every_round", "on_low_approval")
