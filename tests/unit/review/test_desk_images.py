"""Images on the review desk: a prompt shows each image part as a line ``[image N: ...]``, never its
base64; the ``image`` endpoint serves a ``data:`` image of a sample's record (the page's thumbnail),
bounded by review_whole_field_bytes, and never one the record names by a path."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_batchinfer.review.prompt_text import Prompts
from tests.support.desk_images import (  # noqa: F401 (images_desk: the fixture, used by name)
    NOISE,
    RED,
    batch_record,
    images_desk,
    with_images,
)
from tests.support.images import data_url


def test_a_prompt_shows_each_image_as_a_line_never_its_base64() -> None:
    text = Prompts(None, None).text(batch_record(with_images()), "c1", 1)
    kib = len(data_url(RED).partition(",")[2]) * 3 // 4 / 1024
    assert text.startswith(
        f"what colour?\n[image 1: data:image/png, {kib:.1f} KiB]\n[image 2: s3://b/cats/1.png]\n"
    )
    assert text.endswith(f"[image 3: data:image/png, {len(NOISE) / 1024:.1f} KiB]")


def url(suffix: str) -> str:
    return f"/batchinfer/api/gates/desk/images{suffix}"


@pytest.mark.airflow
def test_the_image_endpoint_serves_a_records_data_image_only(
    images_desk: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sample = images_desk.get("bob", url("/page"), params={"size": 1}).json()["samples"][0]
    assert "[image 1: data:image/png" in sample["prompt"]
    where = {"shard": sample["shard_id"], "position": sample["position"]}
    r = images_desk.get("bob", url("/image"), params={**where, "index": 1})
    assert r.status_code == 200, r.text
    assert r.content == RED and r.headers["content-type"] == "image/png"
    assert r.headers["content-security-policy"] == "default-src 'none'"
    assert r.headers["x-content-type-options"] == "nosniff"
    r = images_desk.get("bob", url("/image"), params={**where, "index": 2})  # named by a path: not served
    assert r.status_code == 404 and "serves only images inside the record" in r.json()["detail"]
    r = images_desk.get("bob", url("/image"), params={**where, "index": 4})
    assert r.status_code == 404 and "the sample has 3 image(s)" in r.json()["detail"]
    assert images_desk.get("bob", url("/image"), params={**where, "index": 3}).content == NOISE
    monkeypatch.setenv("AIRFLOW__BATCHINFER__REVIEW_WHOLE_FIELD_BYTES", str(64 * 1024))
    r = images_desk.get("bob", url("/image"), params={**where, "index": 3})
    assert r.status_code == 413 and "review_whole_field_bytes" in r.json()["detail"]
    assert images_desk.get("bob", url("/image"), params={**where, "index": 1}).status_code == 200


@pytest.mark.airflow
def test_the_image_endpoint_is_refused_to_whoever_may_not_read_the_run(
    images_desk: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.api_fastapi.app import get_auth_manager

    am = get_auth_manager()
    real = am.is_authorized_dag
    monkeypatch.setattr(am, "is_authorized_dag",
                        lambda *, user, **kw: user.get_id() != "dave" and real(user=user, **kw))  # fmt: skip
    params = {"shard": "part-00000", "position": 0, "index": 1}
    assert images_desk.get("dave", url("/image"), params=params).status_code == 403
