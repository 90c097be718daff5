"""A stand-in for Airflow's task instance, for operator code called outside Airflow."""

from __future__ import annotations


# ------------------------------- issue 22 round two, should-fix 4: a DAG built without limits=
class FakeTI:
    dag_id, run_id, try_number = "hand_built", "manual__1", 1

    def get_dagrun_state(self, dag_id: str, run_id: str) -> str | None:
        return None
