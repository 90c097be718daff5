"""Airflow operators (need the ``airflow`` extra). The round pipeline's steps, one module each:
``shard`` (the run's first task), ``shard_jobs`` (infer, judge, in-place retry; mapped and
deferrable), ``rounds`` (round controller with review, close round), ``pool`` (setup/teardown),
``preflight`` and ``report``."""
