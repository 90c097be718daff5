"""The objects built from a Kubernetes pool spec (no server)."""

from __future__ import annotations

import json

import pytest

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.pools.kubernetes.objects import worker_deployment
from airflow_batchinfer.pools.kubernetes.spec import GPU_TOLERATION, SPOT_TOLERATIONS, KubernetesPoolSpec


def test_spec_refuses_bad_names_and_missing_prefixes() -> None:
    with pytest.raises(ConfigError, match="DNS label"):
        KubernetesPoolSpec(name="My_Pool", allowed_prefixes=("s3://b/",))
    with pytest.raises(ConfigError, match="allowed_prefixes"):
        KubernetesPoolSpec()
    with pytest.raises(ConfigError, match="unknown Kubernetes pool settings"):
        KubernetesPoolSpec.from_dict({"gpu": 1, "allowed_prefixes": ["s3://b/"]})


def test_deployment_from_spec() -> None:
    spec = KubernetesPoolSpec(
        allowed_prefixes=("s3://b/runs/",), interruptible=True, gpus=2, model_pvc="models",
        node_selector={"pool": "a100"}, engine_options={"max_model_len": 4096},
    )  # fmt: skip
    pod = worker_deployment(spec)["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2" and "cpu" not in c["resources"]["limits"]
    assert pod["tolerations"] == [GPU_TOLERATION, *SPOT_TOLERATIONS] and pod["nodeSelector"] == {
        "pool": "a100"
    }
    assert c["args"] == ["--engine-arg=max_model_len=4096"]
    env = {e["name"]: e for e in c["env"]}
    assert env["BATCHINFER_WORKER_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "batchinfer-token",
        "key": "token",
    }
    assert env["BATCHINFER_WORKER_ALLOW_PREFIX"]["value"] == "s3://b/runs/"
    assert pod["automountServiceAccountToken"] is False and c["securityContext"]["readOnlyRootFilesystem"]
    assert pod["terminationGracePeriodSeconds"] > spec.drain_timeout_s  # the worker drains before SIGKILL
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in c["volumeMounts"]
    cpu = worker_deployment(KubernetesPoolSpec(allowed_prefixes=("s3://b/",), gpus=0))["spec"]["template"][
        "spec"
    ]
    assert "nvidia.com/gpu" not in json.dumps(cpu) and "tolerations" not in cpu
    # what the workers run is in the hash; scale and lifecycle are not
    assert spec.key() == KubernetesPoolSpec.from_dict({**vars(spec), "replicas": 9, "idle_ttl_s": 1}).key()
    assert spec.key() != KubernetesPoolSpec.from_dict({**vars(spec), "image": "other:1"}).key()
