"""On a real worker: a callable judge runs only when the worker was started with ``--allow-callable``
for it (or ``BATCHINFER_WORKER_ALLOW_CALLABLE``); otherwise the job is a 400 at submit and nothing is
imported or written."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlFile
from tests.support.workers import start_worker

pytestmark = [pytest.mark.security, pytest.mark.slow]

REPO = str(Path(__file__).resolve().parents[3])
TARGET = "tests.support.judges:approve_unless_stubborn"


def judge_job(tmp_path: Path, target: str) -> JobSpec:
    layout = RunLayout(str(tmp_path / "run"))
    inferred = JsonlFile(layout.inferred(0, "part-00000"))
    with inferred.writer_sync() as w:
        for i in range(5):
            w.write({"id": "stubborn" if i == 0 else f"r{i}", "result": "x", "status": "ok", "attempts": 1})
    return JobSpec(
        job_id="callable-judge",
        kind="judge",
        input=inferred.uri,
        outputs={
            "approved": layout.result(0, "part-00000"),
            "rejected": layout.rejected(0, "part-00000"),
            "manifest": layout.job_manifest(0, "part-00000", "judge"),
        },
        params={"judge": {"type": "callable", "target": target}},
    )


def test_a_worker_allows_no_callable_by_default(tmp_path: Path) -> None:
    w = start_worker(tmp_path, env={"PYTHONPATH": REPO})
    try:
        spec = judge_job(tmp_path, TARGET)
        r = w.http("POST", "/v1/jobs", json=spec.model_dump())
        assert r.status_code == 400, r.text
        detail = r.json()["detail"]
        assert TARGET in detail and "--allow-callable" in detail
        assert not Path(spec.outputs["approved"]).exists()
        r = w.http("POST", "/v1/jobs", json=judge_job(tmp_path, "os:system").model_dump())
        assert r.status_code == 400 and "'os:system' is not allowed" in r.json()["detail"]
    finally:
        w.stop()


@pytest.mark.parametrize("how", ["flag", "env"])
def test_an_allowed_callable_runs(tmp_path: Path, how: str) -> None:
    if how == "flag":
        w = start_worker(
            tmp_path, env={"PYTHONPATH": REPO}, extra=["--allow-callable", "tests.support.judges:"]
        )
    else:
        env = {"PYTHONPATH": REPO, "BATCHINFER_WORKER_ALLOW_CALLABLE": f"m.n:f,{TARGET}"}
        w = start_worker(tmp_path, env=env)
    try:
        spec = judge_job(tmp_path, TARGET)
        status = w.wait(w.submit(spec).job_id)
        assert status.state == "succeeded", status.error
        assert status.counts.model_dump() == {"outcomes": {"approved": 4, "rejected": 1}}
        other = judge_job(tmp_path / "other", "tests.support.workers:start_worker")
        r = w.http("POST", "/v1/jobs", json=other.model_dump())
        assert r.status_code == 400, r.text  # another module: not allowed by either
    finally:
        w.stop()
