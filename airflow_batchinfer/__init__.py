"""airflow-batchinfer: LLM batch inference at 100M-sample scale on Apache Airflow.

The worker side (``storage``, ``batching``, and later ``engines``, ``worker``, ``rpc``) imports
without Airflow; the Airflow side (``hooks``, ``operators``, ``triggers``) needs the ``airflow`` extra.
"""

from __future__ import annotations

__version__ = "0.1.0"
