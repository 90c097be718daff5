"""Development tools: the demo (``batchinfer demo``, ``make demo``), the test suite and the benchmarks
(``bench/``) use them; no production deployment does.

:mod:`~airflow_batchinfer.dev.airflow` starts a throwaway Airflow on this machine (SQLite, the
LocalExecutor, 127.0.0.1 only, generated secrets) and drives it through the REST API;
:mod:`~airflow_batchinfer.dev.local_airflow` adds the controls tests and benchmarks use (kill,
restart, task logs). :mod:`~airflow_batchinfer.dev.workers` starts real worker processes,
:mod:`~airflow_batchinfer.dev.run_batch` runs a batch file through one and through ``vllm run-batch``
and compares the output lines,
:mod:`~airflow_batchinfer.dev.tiny_llama` builds a tiny random Llama offline,
:mod:`~airflow_batchinfer.dev.kube_plane` starts a Kubernetes control plane and
:mod:`~airflow_batchinfer.dev.kubelet` runs its pods as local processes. A deployment runs Airflow
its own way; in the package only ``demo.py`` imports this package.
"""

from __future__ import annotations
