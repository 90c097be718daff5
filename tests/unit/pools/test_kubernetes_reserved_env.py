"""A Kubernetes pool's user ``env`` (the DAG's ``kubernetes`` param) cannot replace what the pod spec
sets itself: the RPC token from the Secret, the storage-prefix and callable allow-lists, the bind
address. Checked when the spec is built, and the worker's own entries come last in the container
anyway (in a container's env the later entry of a name wins)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.pools.kubernetes.objects import worker_deployment
from airflow_batchinfer.pools.kubernetes.spec import KubernetesPoolSpec

pytestmark = pytest.mark.security

PREFIXES = ("s3://bucket/runs/",)


def resolved_env(spec: KubernetesPoolSpec) -> dict[str, dict[str, Any]]:
    """The container's variables as the kubelet resolves them: for a repeated name, the last wins."""
    out: dict[str, dict[str, Any]] = {}
    for entry in worker_deployment(spec)["spec"]["template"]["spec"]["containers"][0]["env"]:
        out[entry["name"]] = entry
    return out


@pytest.mark.parametrize(
    "name",
    [
        "BATCHINFER_WORKER_TOKEN",  # would replace the token from the Secret
        "BATCHINFER_WORKER_TOKEN_FILE",
        "BATCHINFER_WORKER_ALLOW_ANY_PREFIX",  # would switch off the prefix allow-list
        "BATCHINFER_WORKER_ALLOW_PREFIX",
        "BATCHINFER_WORKER_ALLOW_CALLABLE",
        "BATCHINFER_WORKER_HOST",
        "BATCHINFER_WORKER_SOMETHING_NEW",  # the whole namespace is the worker's
        "batchinfer_worker_token",
        "POD_IP",
        "HOME",
        "HF_HUB_OFFLINE",
        "OMP_NUM_THREADS",
    ],
)
def test_user_env_cannot_set_what_the_pod_spec_sets(name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        KubernetesPoolSpec(allowed_prefixes=PREFIXES, env={name: "1"})
    # the DAG's `kubernetes` param arrives through from_dict: the same check
    with pytest.raises(ConfigError, match=name):
        KubernetesPoolSpec.from_dict({"allowed_prefixes": list(PREFIXES), "env": {name: "1"}})


@pytest.mark.parametrize("name", ["", "1ABC", "A-B", "A B", "A=B", "A.B", "ÄB", "A\nB"])
def test_user_env_names_must_be_c_identifiers(name: str) -> None:
    with pytest.raises(ConfigError, match="environment variable name"):
        KubernetesPoolSpec(allowed_prefixes=PREFIXES, env={name: "1"})


def test_user_env_values_must_be_strings() -> None:
    with pytest.raises(ConfigError, match="VLLM_LOGGING_LEVEL"):
        KubernetesPoolSpec(allowed_prefixes=PREFIXES, env={"VLLM_LOGGING_LEVEL": 10})  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match="env"):
        KubernetesPoolSpec(allowed_prefixes=PREFIXES, env=["A=1"])  # type: ignore[arg-type]


def test_ordinary_user_env_reaches_the_worker() -> None:
    spec = KubernetesPoolSpec(
        allowed_prefixes=PREFIXES, env={"VLLM_LOGGING_LEVEL": "DEBUG", "HF_TOKEN": "hf_x", "_X1": ""}
    )
    env = resolved_env(spec)
    assert env["VLLM_LOGGING_LEVEL"]["value"] == "DEBUG" and env["HF_TOKEN"]["value"] == "hf_x"
    assert env["_X1"]["value"] == ""


def test_the_worker_entries_win_even_if_a_reserved_name_got_through() -> None:
    """Defense in depth: a spec whose env was not checked (an object changed after construction) still
    renders a container whose token comes from the Secret and whose prefix allow-list holds."""
    spec = KubernetesPoolSpec(allowed_prefixes=PREFIXES)
    object.__setattr__(
        spec,
        "env",
        {
            "BATCHINFER_WORKER_TOKEN": "attacker",
            "BATCHINFER_WORKER_ALLOW_PREFIX": "/",
            "BATCHINFER_WORKER_HOST": "0.0.0.0",
            "POD_IP": "0.0.0.0",
            "HF_HUB_OFFLINE": "0",
        },
    )
    env = resolved_env(spec)
    assert env["BATCHINFER_WORKER_TOKEN"] == {
        "name": "BATCHINFER_WORKER_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "batchinfer-token", "key": "token"}},
    }
    assert env["BATCHINFER_WORKER_ALLOW_PREFIX"]["value"] == "s3://bucket/runs/"
    assert env["BATCHINFER_WORKER_HOST"]["value"] == "$(POD_IP)"
    assert "valueFrom" in env["POD_IP"] and env["HF_HUB_OFFLINE"]["value"] == "1"


def test_a_storage_secret_cannot_set_the_trust_settings() -> None:
    """``storage_secret`` is mounted with ``envFrom``; ``env`` beats ``envFrom``, so every trust setting
    is in ``env``, the off ones too: a Secret key BATCHINFER_WORKER_ALLOW_ANY_PREFIX=1 (or ..._TOKEN_FILE,
    ..._ALLOW_CALLABLE) changes nothing."""
    spec = KubernetesPoolSpec(allowed_prefixes=PREFIXES, storage_secret="s3-credentials")
    container = worker_deployment(spec)["spec"]["template"]["spec"]["containers"][0]
    assert container["envFrom"] == [{"secretRef": {"name": "s3-credentials"}}]
    env = resolved_env(spec)
    assert env["BATCHINFER_WORKER_ALLOW_ANY_PREFIX"]["value"] == "0"
    assert env["BATCHINFER_WORKER_ALLOW_CALLABLE"]["value"] == ""
    assert env["BATCHINFER_WORKER_TOKEN_FILE"]["value"] == ""
    assert "secretKeyRef" in env["BATCHINFER_WORKER_TOKEN"]["valueFrom"]


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"node_selector": [["pool", "system"]]}, "node_selector: expected an object of label names"),
        ({"node_selector": {"pool": 1}}, "node_selector: expected an object of label names"),
        ({"tolerations": 5}, "tolerations: expected a list"),
        ({"tolerations": ["x"]}, "tolerations: expected objects"),
        ({"allowed_callables": "os:system"}, "allowed_callables: expected a list"),
    ],
)
def test_malformed_placement_is_refused_when_the_spec_is_built(
    settings: dict[str, Any], problem: str
) -> None:
    # a hand-built DAG without limits and the CLI reach the spec directly
    with pytest.raises(ConfigError, match=problem):
        KubernetesPoolSpec.from_dict({"allowed_prefixes": list(PREFIXES), **settings})
