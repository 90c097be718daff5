"""The Airflow plugin: the review desk, a page in the Airflow UI to read a round's rejected samples
and record decisions on them while its review gate is open (docs/review.md, "The review page").

Registered through the ``airflow.plugins`` entry point only (pyproject.toml). Task processes load
plugins too, so this module imports nothing heavy: the FastAPI app
(:mod:`airflow_batchinfer.review.app`) is built on first use of :attr:`BatchInferPlugin.fastapi_apps`,
which only the api-server asks for.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/batchinfer"
log = logging.getLogger(__name__)


class BatchInferPlugin(AirflowPlugin):
    """The review desk: a "Review desk" tab on every DAG run and an entry in the Browse menu, both
    showing the page that :mod:`airflow_batchinfer.review.app` serves under ``/batchinfer``."""

    name = "batchinfer"
    # Relative hrefs: they resolve against the UI's <base href> ([api] base_url's path).
    external_views = [  # noqa: RUF012 - the plugin interface: a class attribute Airflow reads
        {
            "name": "Review desk",
            "href": "batchinfer/review/?dag_id={DAG_ID}&run_id={RUN_ID}",
            "destination": "dag_run",
            "url_route": "review-desk",
        },
        {
            "name": "Review desk",
            "href": "batchinfer/review/",
            "destination": "nav",
            "category": "browse",
            "url_route": "batchinfer-review",
        },
    ]

    @property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """The review desk's app; none (logged) if it cannot be built: a broken page must not keep
        the api-server from starting."""
        try:
            from airflow_batchinfer.review.app import get_app

            app = get_app()
        except Exception:
            log.exception("batchinfer: the review desk could not be built; /batchinfer is not served")
            return []
        return [{"app": app, "url_prefix": URL_PREFIX, "name": "Batch inference review desk"}]
