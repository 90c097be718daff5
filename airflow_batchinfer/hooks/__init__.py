"""Airflow-side hooks (need the ``airflow`` extra)."""
