"""Images on the review desk: a prompt shows each image part as a line ``[image N: ...]``, never its
base64; the ``image`` endpoint serves a ``data:`` image of a sample's record (the page's thumbnail),
bounded by review_whole_field_bytes, and never one the record names by a path."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.review.prompt_text import Prompts
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


def test_a_prompt_shows_each_image_as_a_line_never_its_base64() -> None:
    text = Prompts(None, None).text(batch_record(with_images()), "c1", 1)
    kib = len(data_url(RED).partition(",")[2]) * 3 // 4 / 1024
    assert text.startswith(
        f"what colour?\n[image 1: data:image/png, {kib:.1f} KiB]\n[image 2: s3://b/cats/1.png]\n"
    )
    assert text.endswith(f"[image 3: data:image/png, {len(NOISE) / 1024:.1f} KiB]")


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
def desk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pytest.importorskip("airflow", reason="needs the airflow extra")
    from airflow_batchinfer.state.owner import RunIdentity
    from tests.support import desk as t
    from tests.support.desk import desk_app
    from tests.support.owners import write_owner

    root = image_run(tmp_path_factory.mktemp("images_run")).run_root
    with desk_app(tmp_path_factory.mktemp("airflow")) as desk:
        t.add_gate("images", "round_01.plan", {"run_root": root, "aws_conn_id": None})
        write_owner(root, RunIdentity(t.DAG_ID, "images"))
        desk.roots["images"] = root
        yield desk


def url(suffix: str) -> str:
    return f"/batchinfer/api/gates/desk/images{suffix}"


@pytest.mark.airflow
def test_the_image_endpoint_serves_a_records_data_image_only(
    desk: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sample = desk.get("bob", url("/page"), params={"size": 1}).json()["samples"][0]
    assert "[image 1: data:image/png" in sample["prompt"]
    where = {"shard": sample["shard_id"], "position": sample["position"]}
    r = desk.get("bob", url("/image"), params={**where, "index": 1})
    assert r.status_code == 200, r.text
    assert r.content == RED and r.headers["content-type"] == "image/png"
    assert r.headers["content-security-policy"] == "default-src 'none'"
    assert r.headers["x-content-type-options"] == "nosniff"
    r = desk.get("bob", url("/image"), params={**where, "index": 2})  # named by a path: not served
    assert r.status_code == 404 and "serves only images inside the record" in r.json()["detail"]
    r = desk.get("bob", url("/image"), params={**where, "index": 4})
    assert r.status_code == 404 and "the sample has 3 image(s)" in r.json()["detail"]
    assert desk.get("bob", url("/image"), params={**where, "index": 3}).content == NOISE
    monkeypatch.setenv("AIRFLOW__BATCHINFER__REVIEW_WHOLE_FIELD_BYTES", str(64 * 1024))
    r = desk.get("bob", url("/image"), params={**where, "index": 3})
    assert r.status_code == 413 and "review_whole_field_bytes" in r.json()["detail"]
    assert desk.get("bob", url("/image"), params={**where, "index": 1}).status_code == 200


@pytest.mark.airflow
def test_the_image_endpoint_is_refused_to_whoever_may_not_read_the_run(
    desk: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.api_fastapi.app import get_auth_manager

    am = get_auth_manager()
    real = am.is_authorized_dag
    monkeypatch.setattr(am, "is_authorized_dag",
                        lambda *, user, **kw: user.get_id() != "dave" and real(user=user, **kw))  # fmt: skip
    params = {"shard": "part-00000", "position": 0, "index": 1}
    assert desk.get("dave", url("/image"), params=params).status_code == 403
