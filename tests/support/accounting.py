"""Helpers for the accounting tests: a run's documents without their digests, to compare runs."""

from __future__ import annotations

import json
from pathlib import Path

from airflow_batchinfer.state.config import RunConfig


# ------------------------------------------------------------------------ runs from before digests
def strip_digests(cfg: RunConfig) -> None:
    """Leave the run's digests unknown (the invariant's read-the-ids path): none in any document,
    and a job's own ``ids`` (required) empty."""
    root = Path(cfg.run_root)
    for path in root.rglob("*.json"):
        doc = json.loads(path.read_text())
        if isinstance(doc, dict):
            if path.parent.name == "jobs" and "ids" in doc:
                doc["ids"] = {}
            else:
                doc.pop("ids", None)
            for key in ("shards", "failed_shards"):
                for s in doc[key] if isinstance(doc.get(key), list) else []:
                    s.pop("ids", None)
            path.write_text(json.dumps(doc))
