"""A closed round with rejected rows for the review tests: sharded input, round 0's jobs finished as a
worker would (tests.support.fake_jobs: staged outputs, manifests with digests, plus the
``reason_groups`` a worker counts), then the real close."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.review.browse import Page, RoundView
from airflow_batchinfer.review.samples import Sample
from airflow_batchinfer.run.jobs import round_kinds
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import (
    AcceptedJob,
    read_accepted,
    read_job_manifest,
    read_plan,
    write_accepted,
    write_job_manifest,
    write_run_config,
)
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import shard_dataset
from airflow_batchinfer.storage.location import StorageOptions
from tests.support.fake_jobs import close, counted, finish_job, plan_round, read_rows

RARE = 78  # the one row of the rare group (in the fifth shard)


def reason(i: int) -> str:
    """Four common groups, one rare one (a single row) and some empty reasons."""
    if i == RARE:
        return "a rare reason: 1 of a kind"
    if i % 7 == 0:
        return ""
    return [f"expected {i}, got {i % 5}", f'missing field "f{i}"', f"too long by {i}.5 words",
            f"inference_error: timeout after {i}s", "Simulated verdict"][i % 5]  # fmt: skip


def approved(i: int) -> bool:
    """Every fourth row, and the whole third shard (ids 40-59: its rejected file has no row)."""
    return i % 4 == 1 or 40 <= i < 60


def build_round(
    base: str,
    *,
    n: int = 95,
    per_shard: int = 20,
    reasons: Callable[[int], str] = reason,
    approve: Callable[[int], bool] = approved,
    so: StorageOptions | None = None,
    data_dir: Path | None = None,
) -> RunConfig:
    """Round 0 of a run of ``n`` records ``r000``…, closed; ``base`` is the run's parent (a local path
    or an ``s3://`` prefix); the input file is written to ``data_dir`` (default: ``base``)."""
    data = Path(data_dir or base) / "data.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("".join(json.dumps({"id": f"r{i:03d}", "question": f"What is {i} + 1?"}) + "\n"
                            for i in range(n)))  # fmt: skip
    cfg = RunConfig.of(
        input=str(data),
        run_root=f"{base}/run",
        prompt_template="Q: {{ question }}",
        judge={"type": "llm"},
        records_per_shard=per_shard,
    )
    layout = RunLayout(cfg.run_root)
    cfg = cfg.replace(
        id_field=shard_dataset(
            cfg.data.input, layout.input, records_per_shard=per_shard, storage_options=so
        ).id_field,
    )
    write_run_config(cfg, so)
    plan = plan_round_so(cfg, so)
    (kind,) = round_kinds(cfg, "rounds")
    for shard in plan.shards:
        rows = [
            {**row, "result": f"answer {int(row['id'][1:]) * 3}", "status": "ok", "attempts": 1, "round": 0}
            for row in read_rows(shard.uri, so)
        ]
        ok, bad = [], []
        for row in rows:
            i = int(row["id"][1:])
            if approve(i):
                ok.append({**row, "status": "approved", "judgment": {"approved": True, "reason": "fine"}})
            else:
                judgment = {"approved": False, "reason": reasons(i), "score": round(i / 100, 2)}
                bad.append({**row, "status": "rejected", "judgment": judgment})
        finish_job(
            cfg, kind, 0, shard, {"approved": ok, "rejected": bad},
            counted(approved=len(ok), rejected=len(bad)), so=so,
        )  # fmt: skip
    summary = close_so(cfg, so)
    assert summary["invariant"]["ok"], summary["invariant"]
    return cfg


def plan_round_so(cfg: RunConfig, so: StorageOptions | None) -> Any:
    if so is None:
        return plan_round(cfg)
    from airflow_batchinfer.run.plan import propose_slot
    from airflow_batchinfer.state.docs import write_plan

    plan = propose_slot(cfg, "round-00", so).plan
    write_plan(RunLayout(cfg.run_root), plan, so)
    return plan


def close_so(cfg: RunConfig, so: StorageOptions | None) -> dict[str, Any]:
    plan = read_plan(RunLayout(cfg.run_root), "round-00", so)
    assert plan is not None
    if so is None:
        return close(cfg, plan)
    from airflow_batchinfer.run.close import close_round

    summary = close_round(cfg, plan, so)
    assert summary is not None
    return summary


def drop_manifest_groups(cfg: RunConfig, so: StorageOptions | None = None) -> None:
    """Remove ``reason_groups`` from every round-0 manifest and accepted record: a round whose groups
    are unknown, which the review desk reads."""
    layout = RunLayout(cfg.run_root)
    (kind,) = round_kinds(cfg, "rounds")
    plan = read_plan(layout, "round-00", so)
    assert plan is not None
    for shard in plan.shards:
        uri = layout.job_manifest(0, shard.shard_id, kind)
        m = read_job_manifest(uri, so)
        assert m is not None
        write_job_manifest(uri, m.model_copy(update={"reason_groups": None}), so)
        accepted = layout.accepted(0, shard.shard_id, kind)  # close copies them there too
        doc = read_accepted(accepted, so)
        assert isinstance(doc, AcceptedJob)
        write_accepted(accepted, doc.model_copy(update={"reason_groups": None}), so)


@pytest.fixture
def view(built: RunConfig) -> RoundView:
    return RoundView(built.run_root, 0)


def rejected_ids(n: int = 95) -> list[str]:
    return [f"r{i:03d}" for i in range(n) if not approved(i)]


def all_pages(view: RoundView, **kw: object) -> tuple[list[Page], list[Sample]]:
    pages, cursor = [], None
    while True:
        page = view.page(cursor, **kw)  # type: ignore[arg-type]
        pages.append(page)
        cursor = page.cursor
        if cursor is None:
            return pages, [s for p in pages for s in p.samples]
        assert len(pages) < 1_000


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> RunConfig:
    return build_round(str(tmp_path_factory.mktemp("review")))
