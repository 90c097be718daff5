"""A Kubernetes pool's ``model_cache``: what the spec accepts, and the volume and setting it becomes."""

from __future__ import annotations

import pytest

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.pools.kubernetes.objects import worker_deployment
from airflow_batchinfer.pools.kubernetes.spec import MODEL_CACHE_MOUNT, TRIGGER_KEYS, KubernetesPoolSpec

PREFIXES = {"allowed_prefixes": ["s3://b/runs/"]}


def pod(**kw: object) -> dict:  # type: ignore[type-arg]
    spec = KubernetesPoolSpec.from_dict({**PREFIXES, **kw})
    return worker_deployment(spec)["spec"]["template"]["spec"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("cache", "why"),
    [
        ("/var/cache/models", "model_cache: expected"),
        ({"host_path": "/a", "pvc": "b"}, "model_cache: expected"),
        ({"hostPath": "/a"}, "model_cache: expected"),
        ({"host_path": "var/cache"}, "not an absolute directory"),
        ({"host_path": "/"}, "not an absolute directory"),
        ({"host_path": "/var/../etc"}, "without '..'"),
        ({"pvc": "Models_1"}, "model_cache.pvc: 'Models_1' is not a PersistentVolumeClaim name"),
    ],
)
def test_a_bad_model_cache_is_refused_by_name(cache: object, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        KubernetesPoolSpec.from_dict({**PREFIXES, "model_cache": cache})


def test_a_host_path_cache_is_mounted_read_only_and_named_to_the_worker() -> None:
    spec = pod(model_cache={"host_path": "/var/cache/batchinfer-models"})
    assert {"name": "model-cache", "hostPath": {"path": "/var/cache/batchinfer-models",
            "type": "DirectoryOrCreate"}} in spec["volumes"]  # fmt: skip
    container = spec["containers"][0]
    assert {"name": "model-cache", "mountPath": MODEL_CACHE_MOUNT, "readOnly": True} in container[
        "volumeMounts"
    ]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["BATCHINFER_WORKER_MODEL_CACHE_DIR"] == MODEL_CACHE_MOUNT


def test_a_pvc_cache_is_a_read_only_claim() -> None:
    spec = pod(model_cache={"pvc": "model-cache"})
    claim = {"claimName": "model-cache", "readOnly": True}
    assert {"name": "model-cache", "persistentVolumeClaim": claim} in spec["volumes"]


def test_without_a_cache_nothing_changes() -> None:
    spec = pod()
    assert all(v["name"] != "model-cache" for v in spec["volumes"])
    assert "BATCHINFER_WORKER_MODEL_CACHE_DIR" not in {e["name"] for e in spec["containers"][0]["env"]}
    # a cache added changes what the pods run: they are replaced
    plain = KubernetesPoolSpec.from_dict(PREFIXES)
    assert plain.key() != KubernetesPoolSpec.from_dict({**PREFIXES, "model_cache": {"pvc": "c"}}).key()


def test_a_trigger_cannot_mount_a_host_path() -> None:
    assert "model_cache" not in TRIGGER_KEYS
