"""A run: its settings, its files in storage, and the round logic shared by the Airflow operators and
``batchinfer run``, so both make the same decisions from the same files.

Storage is the truth. A run root holds ``run.json`` (settings), and per round slot a ``plan.json``
(what the controller decided and why), the jobs' completion manifests, ``failed/`` quarantine
records and ``summary.json``.

* :mod:`~airflow_batchinfer.state.config`: :class:`RunConfig`, one run's settings, and a round's with
  what reviews changed;
* :mod:`~airflow_batchinfer.state.layout`: every path a run reads or writes;
* :mod:`~airflow_batchinfer.state.owner`: which DAG run owns a run root;
* :mod:`~airflow_batchinfer.state.docs`: the versioned docs (``run.json``, plans, summaries and
  quarantine records, the jobs' completion manifests, close's accepted docs), one typed model each,
  read and written in one place, a module per document; the review package reads these only;
* :mod:`~airflow_batchinfer.run.prepare`: a run's first step (settings checked, input sharded);
* :mod:`~airflow_batchinfer.run.jobs`: the jobs a round runs per shard;
* :mod:`~airflow_batchinfer.run.gate`: a review gate: what its answer may change, and its caps
  (``changes``); the markdown a reviewer reads (``body``);
* :mod:`~airflow_batchinfer.run.plan`: what a round slot does (decided from a snapshot of storage,
  no I/O) and what a gate's answer makes of it;
* :mod:`~airflow_batchinfer.run.close`: closing a round (accounting, recompaction, summary), with
  :mod:`~airflow_batchinfer.run.settle`, :mod:`~airflow_batchinfer.run.accepted`,
  :mod:`~airflow_batchinfer.run.quarantine` and :mod:`~airflow_batchinfer.run.repeats`.
* :mod:`~airflow_batchinfer.run.report`: the run report and the whole-run id check.

Nothing is imported here: the worker imports the run's documents from :mod:`airflow_batchinfer.state`
alone (no Airflow).
"""
