"""A run whose rows hold texts of megabytes, behind the review desk's app: what the desk clips (the bounds
tests and the browser's truncated view)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.review.bounds import MIB
from airflow_batchinfer.run.jobs import round_kinds
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import write_run_config
from tests.support.fake_jobs import close, counted, finish_job, make_run, plan_round, read_rows

OUTPUT = "o" * (4 * MIB - 5) + "<end>"  # 4 MiB: its end shows whether it came whole


# --------------------------------------------------------------------- through the desk's app
@pytest.fixture(scope="module")
def desk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pytest.importorskip("airflow", reason="needs the airflow extra")
    from tests.support.desk import desk_with_runs

    root = huge_run(tmp_path_factory.mktemp("huge_app")).run_root
    with desk_with_runs(tmp_path_factory, {"huge": root}) as desk:
        yield desk


CONTEXT = "é" * (2 * MIB - 3) + "<end>"  # 4 MiB and 3 bytes in UTF-8 (two bytes a character)
QUESTION = "q" * 900_000  # the prompt is "{{ question }}" (under MAX_PROMPT_CHARS)
REASON = "too long: " + "r" * MIB
HUGE = ("r01", "r14")  # a rejected row of shards 0 and 1


def huge_run(tmp_path: Path, huge: tuple[str, ...] = HUGE) -> RunConfig:
    """30 records in 3 shards, round 0 closed: ids r00, r03, ... approved, the 20 others rejected;
    the rows of ``huge`` hold the big texts."""
    cfg = make_run(tmp_path, review="every_round", max_rounds=3)
    write_run_config(cfg)
    plan = plan_round(cfg)
    kind = round_kinds(cfg, "rounds")[-1]
    for shard in plan.shards:
        ok, bad = [], []
        for row in read_rows(shard.uri):
            if int(row["id"][1:]) % 3 == 0:
                ok.append({**row, "result": "fine", "status": "approved", "judgment": {"approved": True}})
                continue
            row = {**row, "result": f"answer {row['id']}", "status": "rejected", "attempts": 1,
                   "judgment": {"approved": False, "reason": "wrong answer"}}  # fmt: skip
            if row["id"] in huge:
                row.update(result=OUTPUT, question=QUESTION, context=CONTEXT,
                           judgment={"approved": False, "reason": REASON})  # fmt: skip
            bad.append(row)
        finish_job(cfg, kind, 0, shard, {"approved": ok, "rejected": bad},
                   counted(approved=len(ok), rejected=len(bad)))  # fmt: skip
    summary = close(cfg, plan)
    assert (summary["approved"], summary["rejected"]) == (10, 20)
    return cfg
