"""A spot-checked run and one slot of it, for the spot-check and calibration tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow_batchinfer.dev import calibration as c
from airflow_batchinfer.run.plan import apply_choice, propose_slot
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import write_plan, write_run_config
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import shard_dataset
from tests.support.fake_jobs import close
from tests.support.worker_jobs import run_jobs


def spot_run(tmp_path: Path, n: int = 400, per_shard: int = 100, **settings: Any) -> RunConfig:
    """``n`` records ``c00000``… in shards of ``per_shard``, judged by the construction's judge."""
    data = c.write_input(tmp_path / "data.jsonl", n)
    cfg = RunConfig.of(
        input=str(data),
        run_root=str(tmp_path / "run"),
        prompt_template="{{ question }}",
        records_per_shard=per_shard,
        judge=c.JUDGE,
        **{"max_rounds": 2, **settings},
    )
    cfg = cfg.replace(
        id_field=shard_dataset(
            cfg.data.input, RunLayout(cfg.run_root).input, records_per_shard=per_shard
        ).id_field,
    )
    write_run_config(cfg)
    return cfg


def run_slot(cfg: RunConfig, slot: str, choice: str | None = None) -> Any:
    """The slot's plan task (the gate answered ``choice`` when it opens), its jobs and its close."""
    proposal = propose_slot(cfg, slot)
    assert bool(proposal.options) == (choice is not None), proposal.options
    plan = apply_choice(cfg, proposal, choice) if choice else proposal.plan
    write_plan(RunLayout(cfg.run_root), plan)
    if plan.mode == "rounds":
        run_jobs(cfg, [("infer_judge", plan.round, s) for s in plan.shards])
        close(cfg, plan)
    return plan
