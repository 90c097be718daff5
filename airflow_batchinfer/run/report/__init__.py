"""The run report: ``report/summary.json``, ``report/report.md`` and SVG plots, from the files the
rounds left in storage, plus the whole-run id check.

* :mod:`~airflow_batchinfer.run.report.build`: :func:`build_report`, the summary gathered and written;
* :mod:`~airflow_batchinfer.run.report.invariant`: every input id accounted for exactly once;
* :mod:`~airflow_batchinfer.run.report.render`: ``report.md``, and markdown escaping;
* :mod:`~airflow_batchinfer.run.report.plots`: the SVG plots.

Nothing is imported here: import the module that owns a name.
"""
