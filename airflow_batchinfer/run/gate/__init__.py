"""A review gate between rounds.

* :mod:`~airflow_batchinfer.run.gate.changes`: what a gate's answer may change for the next rounds,
  and the deployment's caps over it (the plan step checks an answer with it);
* :mod:`~airflow_batchinfer.run.gate.body`: the markdown a reviewer sees before answering, and the
  links to the run's pages.

Nothing is imported here: import the module that owns a name.
"""
