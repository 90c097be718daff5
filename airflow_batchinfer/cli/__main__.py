"""``python -m airflow_batchinfer.cli``: the ``batchinfer`` script."""

import sys

from airflow_batchinfer.cli import main

sys.exit(main())
