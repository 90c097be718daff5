"""A run whose rejected rows are OpenAI batch records with images, behind the review desk's app: what
the desk shows of images (the unit tests of its image endpoint, the browser's thumbnails)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.run.jobs import round_kinds
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import write_run_config
from tests.support.fake_jobs import close, counted, finish_job, make_run, plan_round, read_rows
from tests.support.images import data_url, image_message, png

RED = png(30, 20, (255, 0, 0))
NOISE = png(160, 160, noise=True)  # about 77 KiB: over review_whole_field_bytes' least, 64 KiB


def batch_record(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"custom_id": "c1", "body": {"model": "m", "messages": messages}}


def with_images() -> list[dict[str, Any]]:
    messages = image_message(data_url(RED), "what colour?")
    parts = messages[0]["content"]
    parts.append({"type": "image_url", "image_url": {"url": "s3://b/cats/1.png"}})  # type: ignore[attr-defined]
    parts.append({"type": "image_url", "image_url": {"url": data_url(NOISE)}})  # type: ignore[attr-defined]
    return messages


def image_run(tmp_path: Path) -> RunConfig:
    """A closed round 0 whose rejected rows are OpenAI batch records with images."""
    cfg = make_run(tmp_path, review="every_round", max_rounds=3)
    write_run_config(cfg)
    plan = plan_round(cfg)
    kind = round_kinds(cfg, "rounds")[-1]
    for shard in plan.shards:
        bad = [
            {**row, "custom_id": row["id"], "body": {"model": "m", "messages": with_images()},
             "result": "blue", "status": "rejected", "attempts": 1,
             "judgment": {"approved": False, "reason": "wrong colour"}}
            for row in read_rows(shard.uri)
        ]  # fmt: skip
        finish_job(cfg, kind, 0, shard, {"approved": [], "rejected": bad}, counted(rejected=len(bad)))
    close(cfg, plan)
    return cfg


@pytest.fixture(scope="module")
def images_desk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pytest.importorskip("airflow", reason="needs the airflow extra")
    from tests.support.desk import desk_with_runs

    root = image_run(tmp_path_factory.mktemp("images_run")).run_root
    with desk_with_runs(tmp_path_factory, {"images": root}) as desk:
        yield desk
