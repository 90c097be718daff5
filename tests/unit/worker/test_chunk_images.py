"""A chunk's images are read concurrently (a bounded pool), in order, under the job's storage policy."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_batchinfer.engines.base import GenerationRequest
from airflow_batchinfer.engines.images import ImageLimits
from airflow_batchinfer.storage.confine import confined
from airflow_batchinfer.worker.jobs import infer
from airflow_batchinfer.worker.jobs.infer import IMAGE_READERS, load_chunk_images
from airflow_batchinfer.worker.security import PrefixPolicy
from tests.support.images import image_message, png

RUNTIME: Any = SimpleNamespace(image_limits=ImageLimits(), storage_options=None)


def test_a_chunks_images_are_read_at_once_in_a_bounded_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four requests' reads meet at a barrier: read one at a time, it would time out."""
    barrier, running, most = threading.Barrier(4, timeout=10), [0], [0]
    lock = threading.Lock()

    def load(request: GenerationRequest, *_: Any) -> GenerationRequest:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        barrier.wait()
        with lock:
            running[0] -= 1
        return request

    monkeypatch.setattr(infer, "load_images", load)
    built: infer.Built = [
        ({"id": f"r{i}"}, GenerationRequest(f"r{i}", messages=image_message(f"/x/{i}.png"))) for i in range(4)
    ]
    assert load_chunk_images(RUNTIME, built) == built
    assert most[0] == 4 <= IMAGE_READERS


def test_order_errors_and_the_storage_policy_hold_across_the_pool(tmp_path: Path) -> None:
    inside, outside = tmp_path / "in", tmp_path / "out"
    inside.mkdir()
    outside.mkdir()
    for i in range(10):
        (inside / f"{i}.png").write_bytes(png(i + 1, 3))
    (outside / "x.png").write_bytes(png(5, 5))
    built: infer.Built = [
        ({"id": f"r{i}"}, GenerationRequest(f"r{i}", messages=image_message(str(inside / f"{i}.png"))))
        for i in range(10)
    ]
    built.insert(3, ({"id": "bad"}, "record 'bad': a prompt error"))
    built.insert(5, ({"id": "far"}, GenerationRequest("far", messages=image_message(str(outside / "x.png")))))
    built.insert(7, ({"id": "text"}, GenerationRequest("text", prompt="no images")))
    with confined(PrefixPolicy([str(inside)])):  # the job's policy, held by the build thread's context
        out = load_chunk_images(RUNTIME, built)
    assert [record["id"] for record, _ in out] == [record["id"] for record, _ in built]
    loaded = {r.request_id: r for _, r in out if isinstance(r, GenerationRequest)}
    assert [loaded[f"r{i}"].images[0].width for i in range(10)] == list(range(1, 11))
    assert out[3][1] == "record 'bad': a prompt error" and loaded["text"].images == ()
    assert isinstance(out[5][1], str) and "outside this worker's allowed prefixes" in out[5][1]
