"""The lease rules of a shared Kubernetes pool, and the objects built from a pool spec (no server)."""

from __future__ import annotations

import json

import pytest

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.pools.kubernetes.objects import worker_deployment
from airflow_batchinfer.pools.kubernetes.spec import GPU_TOLERATION, SPOT_TOLERATIONS, KubernetesPoolSpec
from airflow_batchinfer.pools.leases import LEASES, PoolState


def state(replicas: int = 0, **kw: float) -> PoolState:
    return PoolState(replicas=replicas, idle_ttl_s=kw.get("idle", 60), scaledown_ttl_s=kw.get("down", 10))


def test_demand_is_the_largest_live_lease_and_scale_up_is_immediate() -> None:
    s = state()
    s.acquire("a", 2, now=0, ttl_s=100)
    s.acquire("b", 3, now=1, ttl_s=100)
    assert s.decide(1) == 3


def test_lower_demand_waits_scaledown_ttl() -> None:
    s = state(3, down=10)
    s.acquire("b", 1, now=0, ttl_s=100)
    assert s.decide(0) == 3 and s.low_since == 0
    assert s.decide(9.9) == 3
    assert s.decide(10) == 1 and s.low_since is None
    s.replicas = 1
    s.acquire("c", 2, now=11, ttl_s=100)  # demand back up: at once, and the damping clock resets
    assert s.decide(11) == 2 and s.low_since is None


def test_idle_pool_stays_warm_for_idle_ttl_then_goes_to_zero() -> None:
    s = state(2, idle=60)
    s.acquire("a", 2, now=0, ttl_s=100)
    s.release("a", now=5)
    assert s.decide(64.9) == 2  # a back-to-back run finds it warm
    assert s.decide(65) == 0


def test_expired_lease_is_dropped_and_counts_as_the_last_use() -> None:
    s = state(2, idle=60)
    s.acquire("crashed", 2, now=0, ttl_s=30)
    assert s.decide(29) == 2
    assert s.decide(31) == 2 and "crashed" not in s.leases and s.last_used == 30
    assert s.decide(90) == 0


def test_a_live_run_renews_its_lease_and_a_lapsed_one_cannot() -> None:
    s = state(1, idle=60)
    s.acquire("long-run", 1, now=0, ttl_s=30)
    assert s.renew("long-run", now=25, ttl_s=30) and s.leases["long-run"].expires == 55
    assert not s.renew("long-run", now=56, ttl_s=30)  # lapsed: renewing cannot resurrect it
    assert not s.renew("never-held", now=1, ttl_s=30)


def test_a_pool_never_used_starts_its_idle_clock_when_first_seen() -> None:
    s = state(2, idle=60)  # e.g. applied from k8s/ with replicas set by hand
    assert s.decide(1000) == 2 and s.last_used == 1000
    assert s.decide(1060) == 0


def test_annotations_round_trip() -> None:
    s = state(1, idle=30, down=5)
    s.acquire("dag/run 1", 2, now=10, ttl_s=3600)
    a = s.annotations()
    back = PoolState.from_annotations(
        1, {k: v for k, v in a.items() if v is not None}, idle_ttl_s=0, scaledown_ttl_s=0
    )
    assert back == s and json.loads(a[LEASES] or "")["dag/run 1"]["replicas"] == 2


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
