"""The end-to-end tier's datasets, DAG pools' sizes and run helpers (tests/system/e2e and its DAGs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from airflow_batchinfer.dev.local_airflow import LocalAirflow
from airflow_batchinfer.storage import JsonlDir

POOL_SLOTS = 4  # = replicas (2) x concurrency (2) of the e2e DAGs' local pool
E2E_MAX_MAP_LENGTH = 32  # below e2e_lanes's 40 shards: its rounds map lanes, not shards
JUDGE_POOL_SLOTS = 2  # = judge_replicas (1) x judge_concurrency (2) of e2e_judge_pool's judge pool


def write_dataset(path: Path, n: int, prefix: str = "r") -> list[str]:
    ids = [f"{prefix}{i:04d}" for i in range(n)]
    with path.open("w") as f:
        for i, rid in enumerate(ids):
            f.write(json.dumps({"id": rid, "question": f"question {i}"}) + "\n")
    return ids


def run(
    af: LocalAirflow, dag_id: str, conf: dict[str, Any], **wait: Any
) -> tuple[str, Path, dict[str, Any], list[dict[str, Any]]]:
    run_id = af.trigger(dag_id, conf)
    state = af.wait_run(dag_id, run_id, timeout_s=600, **wait)
    tis = af.task_instances(dag_id, run_id)
    root = Path(conf["output_root"]) / conf["run_name"]
    report_file = root / "report" / "summary.json"
    report = json.loads(report_file.read_text()) if report_file.exists() else {}
    return state, root, report, tis


def rows(directory: Path) -> list[dict[str, Any]]:
    return [r for f in JsonlDir(str(directory)).jsonl_files() for r in f.iter_records()]


def conf_for(root: Path, name: str, n: int, **extra: Any) -> tuple[dict[str, Any], list[str]]:
    data = root / f"{name}.jsonl"
    ids = write_dataset(data, n, prefix=f"{name}-")
    return {"input": str(data), "output_root": str(root / "runs"), "run_name": name, **extra}, ids
