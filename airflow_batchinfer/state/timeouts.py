"""How long the control plane waits on workers: declared once here, read by the RPC client
(:mod:`~airflow_batchinfer.rpc.locate`) and by the run's settings."""

from __future__ import annotations

# One ask of a worker for a job; a silent one is asked again, never skipped.
LOCATE_TIMEOUT_S: float = 5
# A submission's window for a free worker slot (and for silent workers): it bounds the grace below.
SUBMIT_TIMEOUT_S: float = 600
# The ``unreachable_grace_s`` setting (spec/settings.py): its default and bounds. At least one ask's
# timeout, so a worker is asked twice before it is taken for gone; at most half a try's submission
# window, since each try starts a fresh client: a longer grace would never elapse within one try.
UNREACHABLE_GRACE_S: float = 120
UNREACHABLE_GRACE_MIN_S = LOCATE_TIMEOUT_S
UNREACHABLE_GRACE_MAX_S = SUBMIT_TIMEOUT_S // 2
