"""``e2e_downstream``: a DAG scheduled on ``e2e_lanes``'s results asset, as the docs' example of a
downstream DAG (docs/operations.md, "The results asset"). Each run reads the results of each run
that triggered it, from its event's ``extra``, and writes what it saw to
``<BATCHINFER_E2E_ROOT>/downstream/<source run id>.json`` for the test to check."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, task

from airflow_batchinfer import results_asset

ROOT = os.environ.get("BATCHINFER_E2E_ROOT", "/tmp/batchinfer-e2e")
RESULTS = results_asset("e2e_lanes")

with DAG("e2e_downstream", schedule=[RESULTS], catchup=False, tags=["batchinfer"]):

    @task
    def count_results(*, triggering_asset_events: Any = None) -> None:
        from airflow_batchinfer.storage import JsonlDir

        for event in triggering_asset_events[RESULTS]:  # each run since this DAG's last run
            files = JsonlDir(event.extra["results"]).jsonl_files()
            rows = sum(1 for f in files for _ in f.iter_records())
            out = Path(ROOT) / "downstream" / f"{event.source_run_id}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps({"extra": event.extra, "rows": rows}))

    count_results()
