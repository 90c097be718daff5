"""Airflow operators (need the ``airflow`` extra). The round pipeline's steps, one module each:
``shard`` (the run's first task), ``lanes`` (a round's lanes; mapped and deferrable), ``rounds``
(round controller with review, close round), ``pool`` (setup/teardown) and ``report`` (the
pre-flight and the run's report)."""
