"""A Kubernetes pool's cold starts on a real API server (the kubelet stand-in runs the pods): its
``model_cache`` volume in the Deployment, and ``starts(since)`` from its pods and workers."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("kubernetes", reason="needs the kubernetes extra")

from kubernetes import client

from airflow_batchinfer.pools.kubernetes import KubernetesPool
from airflow_batchinfer.pools.kubernetes.spec import MODEL_CACHE_MOUNT
from tests.support.kube_fixture import Kube
from tests.support.kube_pools import spec

pytestmark = [pytest.mark.kubernetes, pytest.mark.slow]


def test_a_pool_with_a_model_cache_mounts_it_and_reports_its_pod_starts(kube: Kube, tmp_path: Path) -> None:
    ns = kube.namespace()
    pool = KubernetesPool(kube.api, "cached", ns)
    cache = {"host_path": "/var/cache/batchinfer-models"}
    since = time.time()
    pool.ensure(spec(ns, tmp_path, name="cached", model_cache=cache))
    assert pool.acquire("run-1", 2) == 2
    pool.wait_ready(2, timeout_s=120)

    dep = kube.api.sanitize_for_serialization(
        client.AppsV1Api(kube.api).read_namespaced_deployment("cached", ns)
    )
    template = dep["spec"]["template"]["spec"]
    volume = {"name": "model-cache", "hostPath": {"path": cache["host_path"], "type": "DirectoryOrCreate"}}
    assert volume in template["volumes"]  # accepted by the API server as rendered
    container = template["containers"][0]
    assert {"name": "model-cache", "mountPath": MODEL_CACHE_MOUNT, "readOnly": True} in container[
        "volumeMounts"
    ]
    assert {"name": "BATCHINFER_WORKER_MODEL_CACHE_DIR", "value": MODEL_CACHE_MOUNT} in container["env"]

    starts = pool.starts(since)
    assert len(starts) == 2 and len({s.worker for s in starts}) == 2
    for s in starts:
        assert s.scheduled_s is not None and s.started_s is not None and s.ready_s is not None, s
        assert s.scheduled_s <= s.started_s <= s.ready_s  # whole seconds: the API's times
        assert s.loaded_s is not None and s.loaded_s + 1 >= s.started_s  # the worker's own mark
    assert pool.starts(time.time() + 2) == []  # none started since: warm pods are not starts
