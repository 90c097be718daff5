"""Engine secrets (the ``openai`` engine's ``api_key`` and ``default_headers``) never travel as
arguments, params or pool state, which others can read: a Kubernetes worker gets them from a Secret
(``secretKeyRef``; the Deployment is readable with the ``view`` role), a local worker from a 0600 file
whose path it is given (argv is readable by every local user, ``pool.json`` by whoever reads the
state directory). A secret given as a plain option is refused with where to put it instead."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from airflow_batchinfer.engines import GenerationRequest
from airflow_batchinfer.engines.openai import OpenAIEngine
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.pools.kubernetes.objects import pool_objects, to_yaml, worker_deployment
from airflow_batchinfer.pools.kubernetes.spec import KubernetesPoolSpec
from airflow_batchinfer.pools.local import LocalPool, LocalPoolSpec
from airflow_batchinfer.rpc.client import SyncWorkerClient
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.spec.limits import TriggerLimits, refusals
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import shard_dataset
from airflow_batchinfer.worker.config import WorkerConfig, load_engine_secrets

pytestmark = pytest.mark.security

SECRET = "sk-test-" + "s3cr3t" * 6
PREFIXES = ("s3://bucket/runs/",)


def container(spec: KubernetesPoolSpec) -> dict[str, Any]:
    return dict(worker_deployment(spec)["spec"]["template"]["spec"]["containers"][0])


# ------------------------------------------------------------------------------------ Kubernetes
def test_the_deployment_names_the_secret_never_a_value() -> None:
    spec = KubernetesPoolSpec(
        engine="openai", model="gpt-test", allowed_prefixes=PREFIXES, engine_secret="llm-credentials",
        engine_options={"base_url": "https://llm.example/v1"},
    )  # fmt: skip
    worker = container(spec)
    assert not any("api_key" in a or "default_headers" in a for a in worker["args"])
    env = {e["name"]: e for e in worker["env"]}
    assert env["OPENAI_API_KEY"] == {
        "name": "OPENAI_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "llm-credentials", "key": "api_key"}},  # required
    }
    assert env["OPENAI_DEFAULT_HEADERS"]["valueFrom"]["secretKeyRef"] == {
        "name": "llm-credentials", "key": "default_headers", "optional": True,
    }  # fmt: skip
    # no variable of the container carries a credential as a plain value
    assert all("value" not in e for e in worker["env"] if e["name"].startswith("OPENAI_"))


@pytest.mark.parametrize("option", ["api_key", "default_headers"])
def test_a_secret_engine_option_is_refused_in_a_kubernetes_spec(option: str) -> None:
    """Before: ``--engine-arg=api_key=sk-…`` in the Deployment's container args."""
    options = {option: SECRET if option == "api_key" else {"X-Key": SECRET}}
    with pytest.raises(ConfigError, match=rf"engine_options\.{option} is a secret.*engine_secret"):
        KubernetesPoolSpec(engine="openai", model="m", allowed_prefixes=PREFIXES, engine_options=options)
    with pytest.raises(ConfigError, match="engine_secret"):  # the DAG's kubernetes path
        KubernetesPoolSpec.from_dict({"engine": "openai", "model": "m", "allowed_prefixes": list(PREFIXES),
                                      "engine_options": options})  # fmt: skip


def test_no_manifest_the_pool_renders_holds_the_secret() -> None:
    spec = KubernetesPoolSpec(engine="openai", model="m", allowed_prefixes=PREFIXES, engine_secret="llm")
    assert SECRET not in to_yaml(pool_objects(spec))
    with pytest.raises(ConfigError, match=r"OPENAI_API_KEY.*engine_secret"):  # nor a plain env value
        KubernetesPoolSpec(
            engine="openai", model="m", allowed_prefixes=PREFIXES, env={"OPENAI_API_KEY": SECRET}
        )


def test_an_engine_secret_for_an_engine_without_secrets_is_refused() -> None:
    with pytest.raises(ConfigError, match="vllm engine takes no secret options"):
        KubernetesPoolSpec(engine="vllm", allowed_prefixes=PREFIXES, engine_secret="llm")
    with pytest.raises(ConfigError, match=r"engine_secret.*not a Secret name"):
        KubernetesPoolSpec(engine="openai", allowed_prefixes=PREFIXES, engine_secret="Bad_Name")


def test_a_trigger_names_only_allowed_engine_secrets() -> None:
    params = {"kubernetes": {"engine_secret": "prod-openai"}}
    assert refusals(params, TriggerLimits()) == [
        "kubernetes.engine_secret 'prod-openai' is not allowed (widen with the DAG's limits, the "
        "[batchinfer] allowed_engine_secrets setting, or the pool connection's extra allowed_engine_secrets)"
    ]
    assert refusals(params, TriggerLimits(allowed_engine_secrets=("prod-openai",))) == []


# ------------------------------------------------------------------------------- params and argv
def test_a_plain_api_key_param_is_refused_even_where_the_key_is_allowed() -> None:
    """Before: allowed_engine_options=api_key let a param carry the key into the workers' argv."""
    limits = TriggerLimits(allowed_engine_options=("api_key", "base_url"))
    (why,) = refusals({"engine_options": {"api_key": SECRET, "base_url": "http://x/v1"}}, limits)
    assert "engine_options.api_key is a secret" in why and "kubernetes.engine_secret" in why
    assert "$OPENAI_API_KEY" in why and SECRET not in why
    judge = {"judge_pool": "local://judge", "judge_engine_options": {"default_headers": {"a": SECRET}}}
    (why,) = refusals(judge, TriggerLimits(allowed_engine_options=("default_headers",),
                                           allowed_worker_pools=("local://judge",)))  # fmt: skip
    assert why.startswith("judge pool: engine_options.default_headers is a secret")


def test_a_dag_whose_defaults_hold_a_secret_is_refused_when_built() -> None:
    """Before: the key became a DAG param default, shown to everyone who may view the DAG."""
    from airflow_batchinfer.dag_factory import build_batch_inference_dag

    with pytest.raises(ConfigError, match=r"the DAG's default engine_options\.api_key is a secret") as err:
        build_batch_inference_dag(
            "leaky", defaults={"engine": "openai", "engine_options": {"api_key": SECRET}}
        )
    assert SECRET not in str(err.value)


def test_a_worker_refuses_a_secret_engine_arg() -> None:
    config = WorkerConfig(engine="openai", model="m", engine_options={"api_key": SECRET}, token="t")
    with pytest.raises(ConfigError, match=r"--engine-arg api_key=\.\.\. is a secret.*--engine-secrets-file"):
        config.validate()
    assert SECRET not in repr(WorkerConfig(engine_secrets={"api_key": SECRET}))


def test_a_local_pool_refuses_a_secret_engine_option(tmp_path: Path) -> None:
    """Before: the key went into every local worker's argv (``--engine-arg api_key=…``) and pool.json."""
    with pytest.raises(ConfigError, match=r"engine_options\.api_key is a secret.*\$OPENAI_API_KEY"):
        LocalPoolSpec(engine="openai", model="m", engine_options={"api_key": SECRET},
                      allowed_prefixes=(str(tmp_path),))  # fmt: skip


# ------------------------------------------------------------------------------ the secrets file
def secrets_file(tmp_path: Path, mode: int, data: Any) -> Path:
    path = tmp_path / "engine-secrets.json"
    path.write_text(json.dumps(data))
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644], ids=lambda m: f"{m:04o}")
def test_a_worker_refuses_a_secrets_file_others_can_read(tmp_path: Path, mode: int) -> None:
    """A real ``batchinfer worker serve`` exits with the reason, before it listens."""
    path = secrets_file(tmp_path, mode, {"api_key": SECRET})
    (tmp_path / "token").write_text("t" * 32)
    cmd = [str(Path(sys.executable).parent / "batchinfer"), "worker", "serve", "--engine", "openai",
           "--model", "m", "--engine-secrets-file", str(path), "--token-file", str(tmp_path / "token"),
           "--allow-prefix", str(tmp_path)]  # fmt: skip
    out = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert out.returncode == 1, out.stderr
    assert f"has mode {mode:04o}" in out.stderr and f"chmod 600 {path}" in out.stderr
    assert SECRET not in out.stderr + out.stdout


def test_a_private_secrets_file_is_read_and_checked(tmp_path: Path) -> None:
    path = secrets_file(tmp_path, 0o600, {"api_key": SECRET, "default_headers": {"X-Org": "o"}})
    assert load_engine_secrets(str(path), "openai") == {"api_key": SECRET, "default_headers": {"X-Org": "o"}}
    path = secrets_file(tmp_path, 0o600, {"api_key": SECRET, "base_url": "http://x"})
    with pytest.raises(ConfigError, match=r"\['base_url'\] are not secret options of the openai engine"):
        load_engine_secrets(str(path), "openai")
    path.write_text("not json " + SECRET)
    with pytest.raises(ConfigError, match="expected a JSON object") as err:
        load_engine_secrets(str(path), "openai")
    assert SECRET not in str(err.value)


async def test_the_engine_sends_its_secrets_as_headers() -> None:
    seen: list[httpx.Headers] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers)
        return httpx.Response(200, json={"choices": [{"text": "ok"}]})

    engine = OpenAIEngine("m", base_url="http://llm.local/v1", api_key=SECRET,
                          default_headers={"OpenAI-Organization": "org-1"},
                          transport=httpx.MockTransport(handler))  # fmt: skip
    await engine.start()
    (result,) = await engine.generate([GenerationRequest("1", prompt="hi")])
    await engine.close()
    assert result.ok and seen[0]["authorization"] == f"Bearer {SECRET}"
    assert seen[0]["openai-organization"] == "org-1"
    assert SECRET not in json.dumps(engine.describe())  # what fingerprints and manifests hold


# ------------------------------------------------------------------- a real local worker, end to end
@pytest.fixture
def openai_stub() -> Iterator[tuple[str, list[str]]]:
    """An OpenAI-compatible endpoint on 127.0.0.1 that records each request's Authorization header."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append(self.headers.get("Authorization") or "")
            body = json.dumps({"choices": [{"message": {"content": "4"}, "finish_reason": "stop"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    finally:
        server.shutdown()
        server.server_close()


def run_one_job(url: str, token: str, tmp_path: Path) -> str:
    """Infer a three-record shard on the worker at ``url``; returns the job's manifest path."""
    src = tmp_path / "q.jsonl"
    src.write_text("".join(json.dumps({"id": i, "q": f"{i} + {i}?"}) + "\n" for i in range(3)))
    layout = RunLayout(str(tmp_path / "run"))
    shard = shard_dataset(str(src), layout.input).shards[0]
    sid = shard.shard_id
    outputs = {"inferred": layout.inferred(0, sid), "manifest": layout.job_manifest(0, sid, "infer")}
    spec = JobSpec(job_id=f"{sid}-infer", kind="infer", input=shard.uri, outputs=outputs,
                   params={"prompt_template": "{{ q }}"})  # fmt: skip
    with SyncWorkerClient(url, token=token) as client:
        client.submit(spec)
        deadline = time.monotonic() + 120
        while (status := client.status(spec.job_id)).state not in ("succeeded", "failed", "cancelled"):
            assert time.monotonic() < deadline, status
            time.sleep(0.1)
    assert status.state == "succeeded", status.error
    return layout.job_manifest(0, sid, "infer")


def test_a_local_worker_gets_its_key_from_a_private_file_never_argv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, openai_stub: tuple[str, list[str]]
) -> None:
    base_url, seen = openai_stub
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)  # where the process that starts the pool has it
    pool = LocalPool("secrets", state_dir=tmp_path / "pools")
    spec = LocalPoolSpec(engine="openai", model="gpt-test", engine_options={"base_url": base_url},
                         allowed_prefixes=(str(tmp_path),), idle_ttl_s=None)  # fmt: skip
    try:
        (url,) = pool.up(spec, timeout_s=120)
        (gen,) = json.loads(pool.state_file.read_text())["generations"].values()
        pid = int(gen["workers"][0]["pid"])
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert SECRET.encode() not in b" ".join(argv)
        path = Path(argv[argv.index(b"--engine-secrets-file") + 1].decode())
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.parent == pool.dir
        assert json.loads(path.read_text()) == {"api_key": SECRET}
        assert SECRET not in pool.state_file.read_text()
        # the worker does not inherit the variable either: the file is its one source
        assert SECRET.encode() not in Path(f"/proc/{pid}/environ").read_bytes()
        manifest = Path(run_one_job(url, pool.token(), tmp_path)).read_text()
        assert seen and set(seen) == {f"Bearer {SECRET}"}  # the key did reach the endpoint
        assert '"fingerprint"' in manifest and SECRET not in manifest
        assert SECRET not in "".join(p.read_text() for p in pool.dir.glob("worker-*.log"))
    finally:
        pool.down()
    assert not path.exists()  # `pool down` removes the generation's secrets
