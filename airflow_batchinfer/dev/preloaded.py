"""Airflow's ``LocalExecutor`` whose task processes start with the package's DAG-building modules
already imported: :class:`~airflow_batchinfer.dev.local_airflow.LocalAirflow` ``preload=True`` (the
test suite's Airflows) names it as ``[core] executor``.

Each task parses its DAG file when it starts; the file imports :mod:`airflow_batchinfer.dag_factory`
(some 180 modules, half a CPU second), which a LocalExecutor task otherwise imports afresh every
time. This executor imports them once, before it forks its worker processes, which fork each task
process: a suite of hundreds of short tasks on two cores saves minutes. The class keeps Airflow's name,
so the pool setup's one-host check sees the LocalExecutor it is."""

from __future__ import annotations

from airflow.executors import local_executor


class LocalExecutor(local_executor.LocalExecutor):
    """``LocalExecutor``, its workers forked with :mod:`airflow_batchinfer.dag_factory` imported."""

    def start(self) -> None:
        import airflow_batchinfer.dag_factory  # noqa: F401 - imported here for the forks to inherit

        super().start()
