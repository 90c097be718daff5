"""Development helpers for the demo (``batchinfer demo``, ``make demo``), not for production deployments.

:mod:`airflow_batchinfer.dev.airflow` starts a throwaway Airflow on this machine (SQLite, the
LocalExecutor, 127.0.0.1 only, generated secrets) and drives it through the REST API. A deployment
runs Airflow its own way; only ``demo.py`` imports this package.
"""

from __future__ import annotations
