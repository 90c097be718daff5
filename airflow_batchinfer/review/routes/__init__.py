"""The review desk's routes, one module per concern, each an ``APIRouter`` that
:func:`airflow_batchinfer.review.app.create_app` mounts:

* :mod:`~.pages`: the page and its script and style;
* :mod:`~.gates`: the open gates, and one DAG run's gate;
* :mod:`~.rounds`: a closed round's summary, pages, samples and trend;
* :mod:`~.fields`: one value whole, and a sample's earlier attempts;
* :mod:`~.shards`: a round's shards and their states;
* :mod:`~.calibration`: the judge against the reviewers;
* :mod:`~.decisions`: the reviewers' decisions.

They import no Airflow: what they need of it (the user, the permissions, the gates, the storage
options) comes through :mod:`~.host`; where a request's run is, from :mod:`~.context`.
"""
