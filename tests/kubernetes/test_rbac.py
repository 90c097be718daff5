"""The Role in k8s/base/rbac.yaml is enough for the pool manager, and no more; without it the manager
is refused with the remedy."""

from __future__ import annotations

import base64
import random
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes", reason="needs the kubernetes extra")

import yaml
from kubernetes import client, config, utils

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.pools.kubernetes import KubernetesPool, KubernetesPoolSpec
from tests.conftest import Kube

pytestmark = [pytest.mark.kubernetes, pytest.mark.slow]
RBAC = Path(__file__).resolve().parents[2] / "k8s" / "base" / "rbac.yaml"


def as_service_account(kube: Kube, ns: str, name: str, tmp_path: Path) -> client.ApiClient:
    """An API client with the token of ServiceAccount ``name`` (its token Secret, Kubernetes 1.20)."""
    core = client.CoreV1Api(kube.api)
    if not any(sa.metadata.name == name for sa in core.list_namespaced_service_account(ns).items):
        core.create_namespaced_service_account(ns, {"metadata": {"name": name}})
    for _ in range(100):
        refs = core.read_namespaced_service_account(name, ns).secrets or []
        if refs:
            break
        time.sleep(0.1)
    token = base64.b64decode(core.read_namespaced_secret(refs[0].name, ns).data["token"]).decode()
    admin = kube.api.configuration
    kubeconfig = tmp_path / f"{ns}-{name}.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "local",
                      "cluster": {"server": admin.host, "certificate-authority": admin.ssl_ca_cert}}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": name, "namespace": ns}}],
    }))  # fmt: skip
    return config.new_client_from_config(config_file=str(kubeconfig))


def spec(ns: str, tmp_path: Path) -> KubernetesPoolSpec:
    return KubernetesPoolSpec(
        name="pool", namespace=ns, engine="simulated", concurrency=1, cpu="1", memory="1Gi",
        port=random.randint(20000, 40000), allowed_prefixes=(str(tmp_path),), drain_timeout_s=5,
    )  # fmt: skip


def forbidden(call: Any) -> bool:
    try:
        call()
    except client.exceptions.ApiException as exc:
        return exc.status == 403
    return False


def test_the_role_in_k8s_is_enough_for_the_whole_pool_lifecycle(kube: Kube, tmp_path: Path) -> None:
    ns = kube.namespace()
    utils.create_from_yaml(kube.api, str(RBAC), namespace=ns)
    api = as_service_account(kube, ns, "batchinfer-airflow", tmp_path)
    review = {"spec": {"resourceAttributes": {"namespace": ns, "verb": "create", "group": "apps",
                                              "resource": "deployments"}}}  # fmt: skip
    for _ in range(100):  # the authorizer sees a new binding within moments
        if client.AuthorizationV1Api(api).create_self_subject_access_review(review).status.allowed:
            break
        time.sleep(0.1)
    pool = KubernetesPool(api, "pool", ns)
    assert pool.ensure(spec(ns, tmp_path)) == "created"
    pool.acquire("run", 1)
    assert len(pool.wait_ready(1, timeout_s=90)) == 1
    assert pool.token() and pool.status()["ready"] == 1
    assert pool.release("run") == 1
    assert pool.scale_to_zero() == 0
    pool.delete()
    assert not client.AppsV1Api(kube.api).list_namespaced_deployment(ns).items

    # ... and no more: no listing Secrets, deleting pods, exec, nodes, or other namespaces
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    assert forbidden(lambda: core.list_namespaced_secret(ns))
    assert forbidden(lambda: core.delete_collection_namespaced_pod(ns))
    assert forbidden(lambda: core.list_node())
    assert forbidden(lambda: apps.list_namespaced_deployment("default"))
    assert forbidden(
        lambda: client.RbacAuthorizationV1Api(api).create_namespaced_role(
            ns, {"metadata": {"name": "x"}, "rules": []}
        )
    )


def test_without_the_role_the_manager_is_refused_with_the_remedy(kube: Kube, tmp_path: Path) -> None:
    ns = kube.namespace()
    api = as_service_account(kube, ns, "nobody", tmp_path)
    with pytest.raises(ConfigError, match=r"refused to read secrets .*k8s/base/rbac\.yaml"):
        KubernetesPool(api, "pool", ns).ensure(spec(ns, tmp_path))
    with pytest.raises(ConfigError, match=r"refused to read deployments"):
        KubernetesPool(api, "pool", ns).acquire("run", 1)
