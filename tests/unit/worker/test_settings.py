"""One description of a worker's settings (``airflow_batchinfer.worker.settings``): the ``worker serve``
flags and their variables, ``WorkerConfig``, a local pool's worker command line and a Kubernetes pool's
container environment all come from it, and every layer that configures workers shares its defaults."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import inspect
import subprocess
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.cli import build_parser
from airflow_batchinfer.judges.rules import ALLOW_CALLABLE_ENV, ALLOW_CALLABLE_FLAG
from airflow_batchinfer.pools import local_workers
from airflow_batchinfer.pools.kubernetes.objects import worker_deployment
from airflow_batchinfer.pools.kubernetes.spec import KubernetesPoolSpec
from airflow_batchinfer.pools.local import LocalPool, LocalPoolSpec
from airflow_batchinfer.spec.settings import setting
from airflow_batchinfer.worker.config import WorkerConfig
from airflow_batchinfer.worker.runtime import Runtime
from airflow_batchinfer.worker.settings import (
    ENV_PREFIX,
    POOL_IDLE_TTL_S,
    TOKEN_ENV,
    WORKER_SETTINGS,
    add_worker_arguments,
    reference_table,
    settings_from_args,
    worker_default,
    worker_setting,
)

# What users, scripts and the k8s/ manifests spell: these must keep working.
FLAGS_AND_VARIABLES = {
    "--engine": "ENGINE", "--model": "MODEL", "--model-cache-dir": "MODEL_CACHE_DIR", "--engine-arg": None,
    "--concurrency": "CONCURRENCY",
    "--host": "HOST", "--port": "PORT", "--token-file": "TOKEN_FILE",
    "--engine-secrets-file": "ENGINE_SECRETS_FILE", "--insecure-no-auth": None,
    "--allow-prefix": "ALLOW_PREFIX", "--allow-any-prefix": "ALLOW_ANY_PREFIX",
    "--allow-callable": "ALLOW_CALLABLE", "--allow-adapter": "ALLOW_ADAPTER",
    "--max-body-bytes": "MAX_BODY_BYTES", "--max-image-bytes": "MAX_IMAGE_BYTES",
    "--max-image-pixels": "MAX_IMAGE_PIXELS", "--max-images-per-request": "MAX_IMAGES_PER_REQUEST",
    "--max-image-bytes-per-request": "MAX_IMAGE_BYTES_PER_REQUEST", "--idle-ttl": "IDLE_TTL",
    "--lease-file": "LEASE_FILE", "--drain-timeout": "DRAIN_TIMEOUT",
    "--target-batch-tokens": "TARGET_BATCH_TOKENS", "--max-batch-size": "MAX_BATCH_SIZE",
    "--batch-timeout": "BATCH_TIMEOUT", "--max-concurrent-batches": None, "--announce-file": None,
}  # fmt: skip
# WorkerConfig fields that are no setting: read from files (never argv), or not on the command line
NOT_SETTINGS = {"token", "engine_secrets", "storage_options"}


def serve_args(argv: list[str], environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The worker settings ``batchinfer worker serve ARGV`` runs with, in ``environ`` (default: empty)."""
    parser = argparse.ArgumentParser()
    add_worker_arguments(parser, environ={} if environ is None else environ)
    return settings_from_args(parser.parse_args(argv))


def test_the_flags_and_variables_users_spell_are_the_specs() -> None:
    got = {s.flag: s.env for s in WORKER_SETTINGS}
    assert got == {f: None if v is None else ENV_PREFIX + v for f, v in FLAGS_AND_VARIABLES.items()}
    callables = worker_setting("allowed_callables")
    assert (callables.flag, callables.env) == (ALLOW_CALLABLE_FLAG, ALLOW_CALLABLE_ENV)  # the judges' errors
    assert TOKEN_ENV == "BATCHINFER_WORKER_TOKEN" and "--token" not in got  # the token itself is no flag
    # the CLI's own parser is this one
    cli = build_parser().parse_args(["worker", "serve"])
    assert {s.name for s in WORKER_SETTINGS} <= set(vars(cli))


def test_worker_config_is_the_settings_with_their_defaults() -> None:
    fields = {f.name: f for f in dataclasses.fields(WorkerConfig)}
    config_settings = {s.name for s in WORKER_SETTINGS if s.config}
    assert set(fields) == config_settings | NOT_SETTINGS
    assert {s.name for s in WORKER_SETTINGS if not s.config} == {"token_file", "engine_secrets_file",
                                                                 "allow_any_prefix"}  # fmt: skip
    plain = WorkerConfig()
    for name in config_settings:
        assert getattr(plain, name) == worker_default(name), name
    assert plain.engine_options is not WorkerConfig().engine_options  # no shared mutable default


def test_flags_and_variables_parse_to_the_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    defaults = serve_args([])
    assert defaults == {s.name: worker_default(s.name) for s in WORKER_SETTINGS}
    given = {"CONCURRENCY": "7", "ALLOW_PREFIX": "/a,/b", "ALLOW_CALLABLE": " m:f , n: ",
             "ALLOW_ANY_PREFIX": "1", "IDLE_TTL": "", "BATCH_TIMEOUT": "0.5", "TOKEN_FILE": ""}  # fmt: skip
    env = {ENV_PREFIX + k: v for k, v in given.items()}
    got = serve_args([], env)
    assert (got["concurrency"], got["allowed_prefixes"], got["allowed_callables"]) == (
        7,
        ["/a", "/b"],
        ["m:f", "n:"],
    )
    assert got["allow_any_prefix"] is True and got["idle_ttl_s"] is None and got["batch_timeout_s"] == 0.5
    assert serve_args(["--concurrency", "2"], env)["concurrency"] == 2  # a flag beats its variable
    with pytest.raises(SystemExit):  # a bad number in a variable is a usage error, not a traceback
        serve_args([], {ENV_PREFIX + "PORT": "eighty"})
    # into a WorkerConfig: the token from its file, every location with allow_any_prefix
    (tmp_path / "token").write_text("s3cret\n")
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    values = serve_args(["--token-file", str(tmp_path / "token"), "--engine-arg", "dtype=bfloat16",
                         "--engine-arg", "max_model_len=512"], env)  # fmt: skip
    config = WorkerConfig.from_settings(values)
    assert config.token == "s3cret" and config.allowed_prefixes is None and config.concurrency == 7
    assert config.engine_options == {"dtype": "bfloat16", "max_model_len": 512}
    config.validate()


def test_validate_refuses_what_the_settings_bound() -> None:
    from airflow_batchinfer.exceptions import ConfigError

    for name, value in (("concurrency", 0), ("max_body_bytes", 1000), ("target_batch_tokens", 0)):
        flag = worker_setting(name).flag
        with pytest.raises(ConfigError, match=f"{flag} must be >= "):
            config = WorkerConfig(token="t")
            setattr(config, name, value)
            config.validate()


class FakeProcess:
    next_pid = 4_100_000

    def __init__(self, cmd: list[str], **kwargs: Any) -> None:
        FakeProcess.next_pid += 1
        self.pid, self.cmd = FakeProcess.next_pid, cmd

    def poll(self) -> int | None:
        return None


def test_a_local_pool_starts_its_workers_with_its_spec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    procs: list[FakeProcess] = []

    def popen(cmd: list[str], **kwargs: Any) -> FakeProcess:
        procs.append(FakeProcess(cmd))
        return procs[-1]

    monkeypatch.setattr(subprocess, "Popen", popen)  # the module local_workers.py starts workers with
    monkeypatch.setattr(local_workers, "_CHILDREN", {})
    spec = LocalPoolSpec(
        engine="transformers", model="/models/m", engine_options={"dtype": "float32", "threads": 2},
        concurrency=3, idle_ttl_s=42.0, allowed_prefixes=(str(tmp_path), "/data"), target_batch_tokens=999,
        allowed_callables=("my_pkg.checks:is_good",), allowed_adapters=("/models/lora/",),
    )  # fmt: skip
    pool = LocalPool("p", state_dir=tmp_path / "pools")
    pool.start(spec)
    cmd = procs[0].cmd
    assert cmd[1:3] == ["worker", "serve"]
    got = serve_args(cmd[3:])
    for name in ("engine", "model", "engine_options", "concurrency", "idle_ttl_s", "target_batch_tokens"):
        assert got[name] == getattr(spec, name), name
    assert tuple(got["allowed_prefixes"]) == spec.allowed_prefixes
    assert tuple(got["allowed_callables"]) == spec.allowed_callables
    assert tuple(got["allowed_adapters"]) == spec.allowed_adapters
    assert (got["host"], got["port"], got["token_file"]) == ("127.0.0.1", 0, str(pool.dir / "token"))
    assert got["lease_file"] == str(pool.dir / f"leases-{spec.key()}.json") and got["announce_file"]
    # a pool whose workers never idle out gives them no idle time and no lease file
    LocalPool("q", state_dir=tmp_path / "pools").start(dataclasses.replace(spec, idle_ttl_s=None))
    last = serve_args(procs[-1].cmd[3:])
    assert last["idle_ttl_s"] is None and last["lease_file"] is None


def test_a_kubernetes_pool_sets_its_spec_as_the_workers_variables() -> None:
    spec = KubernetesPoolSpec(
        allowed_prefixes=("s3://b/runs/", "s3://b/in/"), allowed_callables=("m:f", "n:"), model="/models/m",
        allowed_adapters=("/models/lora-sql", "/models/lora/"),
        engine_options={"max_model_len": 4096, "dtype": "bfloat16"}, concurrency=3, target_batch_tokens=999,
        port=9000, drain_timeout_s=120, env={"VLLM_LOGGING_LEVEL": "INFO"},
    )  # fmt: skip
    container = worker_deployment(spec)["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    ours = {name for name in env if name.startswith(ENV_PREFIX)}
    assert ours - {TOKEN_ENV} <= {s.env for s in WORKER_SETTINGS}
    assert env[ENV_PREFIX + "HOST"] == "$(POD_IP)"
    env[ENV_PREFIX + "HOST"] = "10.0.0.1"  # as the kubelet expands it
    got = serve_args(container.get("args", []), {k: v for k, v in env.items() if v is not None})
    for name in ("engine", "model", "engine_options", "concurrency", "port", "target_batch_tokens",
                 "drain_timeout_s"):  # fmt: skip
        assert got[name] == getattr(spec, name), name
    assert tuple(got["allowed_prefixes"]) == spec.allowed_prefixes
    assert tuple(got["allowed_callables"]) == spec.allowed_callables
    assert tuple(got["allowed_adapters"]) == spec.allowed_adapters
    assert got["allow_any_prefix"] is False and got["token_file"] == "" and got["host"] == "10.0.0.1"


needs_airflow = pytest.mark.skipif(
    importlib.util.find_spec("airflow") is None, reason="needs the airflow extra"
)


def _signature_defaults(fn: Any) -> dict[str, Any]:
    return {k: p.default for k, p in inspect.signature(fn).parameters.items()}


def test_one_default_per_setting() -> None:
    """The DAG params, ``batchinfer pool up``/``run``/``plan``, the pool specs, the worker's flags,
    ``WorkerConfig`` and ``Runtime`` share the workers' defaults, but where they differ on purpose."""
    local_spec = {f.name: f.default for f in dataclasses.fields(LocalPoolSpec)}
    kube_spec = {f.name: f.default for f in dataclasses.fields(KubernetesPoolSpec)}
    up = build_parser().parse_args(["pool", "up", "--allow-prefix", "/x"])
    run = build_parser().parse_args(["run", "in.jsonl", "/runs/r"])
    plan = build_parser().parse_args(["plan", "--records", "1", "--gpus", "1", "--tokens-per-s", "1"])
    serve = serve_args([])
    for name in ("concurrency", "target_batch_tokens"):
        one = worker_default(name)
        assert setting(name).default == local_spec[name] == getattr(WorkerConfig(), name) == one, name
        assert getattr(up, name) == getattr(run, name) == serve[name] == one, name
    assert kube_spec["target_batch_tokens"] == worker_default("target_batch_tokens")
    assert plan.concurrency == setting("judge_concurrency").default == worker_default("concurrency")
    runtime = _signature_defaults(Runtime)
    for name in ("target_batch_tokens", "max_batch_size", "batch_timeout_s"):
        assert runtime[name] == worker_default(name), name
    # a pool keeps its workers for one idle time; a worker alone never idles out
    assert (
        setting("idle_ttl_s").default
        == local_spec["idle_ttl_s"]
        == kube_spec["idle_ttl_s"]
        == POOL_IDLE_TTL_S
    )
    assert up.idle_ttl == run.idle_ttl == POOL_IDLE_TTL_S and worker_default("idle_ttl_s") is None
    assert kube_spec["drain_timeout_s"] == worker_default("drain_timeout_s")
    # the engine: the workers' everywhere but a DAG's trigger form (a real small model) and a
    # Kubernetes pool (a GPU Deployment of the vLLM image, with the slots that keep vLLM busy)
    assert local_spec["engine"] == up.engine == run.engine == serve["engine"] == worker_default("engine")
    assert (setting("engine").default, setting("model").default) == ("transformers", "builtin:smollm2")
    assert (kube_spec["engine"], kube_spec["concurrency"], kube_spec["port"]) == ("vllm", 8, 8000)
    assert local_spec["model"] == kube_spec["model"] == up.model == worker_default("model")


@needs_airflow
def test_the_pool_setup_takes_the_workers_defaults() -> None:
    from airflow_batchinfer.operators.pool import PoolSetupOperator

    defaults = _signature_defaults(PoolSetupOperator.__init__)
    for name in ("engine", "model", "concurrency", "target_batch_tokens"):
        assert defaults[name] == worker_default(name), name
    assert defaults["idle_ttl_s"] == POOL_IDLE_TTL_S


def test_the_docs_table_has_a_row_per_setting() -> None:
    header, rows = reference_table()
    assert [r[0].split("``")[1].split()[0] for r in rows] == [s.flag for s in WORKER_SETTINGS]
    assert all(len(r) == len(header) for r in rows)
