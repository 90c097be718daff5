"""The run's ``sampling`` is checked against its pool's engine before the pre-flight runs a job: a
field that engine does not honour stops the run there, naming the field and the engine."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from airflow_batchinfer.engines import create_engine
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.run.preflight import run_preflight
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import write_run_config
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import shard_dataset
from airflow_batchinfer.worker.app import create_app
from airflow_batchinfer.worker.config import WorkerConfig
from airflow_batchinfer.worker.runtime import Runtime

TOKEN = "t" * 32


class TransformersWorker(httpx.AsyncBaseTransport):
    """The worker app over ASGI with the transformers engine, started on the first request's loop."""

    def __init__(self, tmp_path: Path, model: str) -> None:
        config = WorkerConfig(token=TOKEN, allowed_prefixes=[str(tmp_path)], concurrency=2)
        self.runtime = Runtime(create_engine("transformers", model=model), batch_timeout_s=0.001)
        self.asgi = httpx.ASGITransport(app=create_app(config, self.runtime))
        self.started = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not self.started:
            self.started = True
            await self.runtime.start()
        return await self.asgi.handle_async_request(request)

    async def aclose(self) -> None:
        if self.started:
            await self.runtime.close()


def test_a_sampling_field_the_pools_engine_lacks_stops_the_run_before_any_job(
    tmp_path: Path, tiny_model: str
) -> None:
    pytest.importorskip("torch", reason="needs the transformers extra")
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": i, "q": f"q{i}"}) + "\n" for i in range(10)))
    cfg = RunConfig.of(input=str(data), run_root=str(tmp_path / "run"), prompt_template="{{ q }}",
                       judge={"type": "length", "min_chars": 1}, preflight_records=4,
                       sampling={"presence_penalty": 0.5, "max_tokens": 4})  # fmt: skip
    cfg.validate()  # vllm, openai and simulated honour it: the run starts
    shard_dataset(cfg.data.input, RunLayout(cfg.run_root).input)
    write_run_config(cfg)
    with pytest.raises(ConfigError) as refused:
        run_preflight(cfg, ["http://worker"], TOKEN, transport=TransformersWorker(tmp_path, tiny_model))
    why = str(refused.value)
    assert why.startswith(
        "bad run settings: sampling.presence_penalty=0.5 is refused: the transformers engine"
    )
    assert not (Path(RunLayout(cfg.run_root).preflight) / "infer_judge.json").exists()  # no job ran
