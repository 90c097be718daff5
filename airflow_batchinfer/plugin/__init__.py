"""The Airflow plugin: the review desk, a page in the Airflow UI to read a round's rejected samples
and record decisions on them while its review gate is open (docs/review.md, "The review page").

Registered through the ``airflow.plugins`` entry point only (pyproject.toml). Task processes load
plugins too, so this module imports nothing heavy: the FastAPI app (:mod:`airflow_batchinfer.plugin.desk`:
the desk's routes on Airflow's login, permissions and database) is built on first use of
:attr:`BatchInferPlugin.fastapi_apps`, which only the api-server asks for.

The desk needs Airflow 3.3 (:func:`airflow_batchinfer.compat.review_desk_unavailable`): on an older
Airflow the plugin lists no views and serves no app, and the api-server's log says why.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow.plugins_manager import AirflowPlugin

from airflow_batchinfer.compat import review_desk_unavailable

URL_PREFIX = "/batchinfer"
log = logging.getLogger(__name__)
UNAVAILABLE = review_desk_unavailable()  # None where this Airflow has what the desk needs


class BatchInferPlugin(AirflowPlugin):
    """The review desk: a "Review desk" tab on every DAG run and an entry in the Browse menu, both
    showing the page that :mod:`airflow_batchinfer.plugin.desk` serves under ``/batchinfer``; neither
    on an Airflow older than the desk needs (:data:`UNAVAILABLE` says why)."""

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
    if UNAVAILABLE:  # no tab or menu entry that would lead to a 404
        external_views = []

    @property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """The review desk's app; none (logged) if this Airflow is older than it needs or it cannot
        be built: a broken page must not keep the api-server from starting."""
        if UNAVAILABLE:
            log.warning("batchinfer: %s", UNAVAILABLE)
            return []
        try:
            from airflow_batchinfer.plugin.desk import get_app

            app = get_app()
        except Exception:
            log.exception("batchinfer: the review desk could not be built; /batchinfer is not served")
            return []
        return [{"app": app, "url_prefix": URL_PREFIX, "name": "Batch inference review desk"}]
