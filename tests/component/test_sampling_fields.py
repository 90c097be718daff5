"""No silent drops on a real worker over HTTP with the transformers engine (a tiny Llama): an OpenAI
batch file whose records ask for honoured, no-op and refused fields. A refused record is that record's
error row naming the field; the others are answered; every id comes back. The job's own sampling is
refused per record for a field the engine does not honour, and at submit for one no engine does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.exceptions import BadJobError
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlFile, shard_dataset
from tests.support.workers import WorkerProcess, start_worker

pytestmark = pytest.mark.slow

ASKS: dict[str, dict[str, Any]] = {
    "honoured": {"repetition_penalty": 1.3, "top_k": 3, "temperature": 0.8, "seed": 5, "min_tokens": 1},
    "no-op": {"user": "u-1", "metadata": {"team": "evals"}, "n": 1, "stream": False, "model": "gpt-4o"},
    "engine-refused": {"presence_penalty": 0.5},
    "refused": {"best_of": 2},
    "unknown": {"guided_json": {"type": "object"}},
    "plain": {},
}


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory, tiny_model: str) -> Any:
    w = start_worker(tmp_path_factory.mktemp("sampling"), engine="transformers", model=tiny_model)
    yield w
    w.stop()


def infer(
    worker: WorkerProcess,
    tmp_path: Path,
    records: list[dict[str, Any]],
    id_field: str = "custom_id",
    **params: Any,
) -> JobSpec:
    src = tmp_path / "batch.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    layout = RunLayout(str(worker.log.parent / tmp_path.name / "run"))
    (shard,) = shard_dataset(str(src), layout.input, id_field=id_field).shards
    sid = shard.shard_id
    return JobSpec(
        job_id=f"{tmp_path.name}-{sid}-infer",
        kind="infer",
        input=shard.uri,
        outputs={"inferred": layout.inferred(0, sid), "manifest": layout.job_manifest(0, sid, "infer")},
        params={"input_records": shard.records, "id_field": id_field, **params},
    )


def rows(uri: str) -> list[dict[str, Any]]:
    return list(JsonlFile(uri).iter_records())


def batch_line(custom_id: str, asks: dict[str, Any]) -> dict[str, Any]:
    body = {"model": "m", "messages": [{"role": "user", "content": f"{custom_id}?"}], "max_tokens": 6, **asks}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def test_an_openai_batch_file_honours_or_refuses_each_field_per_record(
    tmp_path: Path, worker: WorkerProcess
) -> None:
    records = [batch_line(name, asks) for name, asks in ASKS.items()]
    spec = infer(worker, tmp_path, records, output_format="openai")
    status = worker.wait(worker.submit(spec).job_id)
    assert (
        status.state == "succeeded" and status.counts.generated.error == 3 and status.counts.generated.ok == 3
    )
    out = {r["custom_id"]: r for r in rows(spec.outputs["inferred"])}
    assert list(out) == list(ASKS)  # one line per record, in order: the id invariant
    for name in ("honoured", "no-op", "plain"):
        body = out[name]["response"]["body"]
        (choice,) = body["choices"]
        assert set(choice) == {"index", "message", "logprobs", "finish_reason"} and choice["logprobs"] is None
        assert choice["message"]["role"] == "assistant" and choice["finish_reason"] in ("stop", "length")
        assert (
            body["usage"]["total_tokens"]
            == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
        )
    errors = {name: out[name]["error"]["message"] for name in ("engine-refused", "refused", "unknown")}
    assert all(out[name]["response"] is None for name in errors)
    assert errors["engine-refused"].startswith("record 'engine-refused': body field presence_penalty=0.5")
    assert "transformers engine does not honour it" in errors["engine-refused"]
    assert errors["refused"].startswith("record 'refused': body field best_of=2 is refused")
    assert "set it to 1" in errors["refused"]
    assert "body field guided_json is not a field" in errors["unknown"]


def test_the_jobs_sampling_is_honoured_or_refused_too(tmp_path: Path, worker: WorkerProcess) -> None:
    records = [{"id": f"q{i}", "q": f"{i}+{i}"} for i in range(4)]
    spec = infer(worker, tmp_path, records, "id", prompt_template="What is {{ q }}?",
                 sampling={"frequency_penalty": 0.4, "max_tokens": 4})  # fmt: skip
    status = worker.wait(worker.submit(spec).job_id)
    assert status.state == "succeeded" and status.counts.generated.error == 4
    out = rows(spec.outputs["inferred"])
    assert [r["id"] for r in out] == ["q0", "q1", "q2", "q3"]
    assert all(
        r["status"] == "error" and "the job's sampling.frequency_penalty is refused" in r["error"]
        for r in out
    )
    spec.params["sampling"] = {"best_of": 4}
    spec.job_id += "-best-of"
    with pytest.raises(BadJobError, match=r"sampling\.best_of=4 is refused"):
        worker.submit(spec)
