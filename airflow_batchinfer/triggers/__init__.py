"""Triggers (run by Airflow's triggerer, which imports them from this package)."""
