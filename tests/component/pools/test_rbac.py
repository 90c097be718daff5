"""The Role in k8s/base/rbac.yaml is enough for the pool manager, and no more, for every identity the
overlays bind it to (the reaper's ServiceAccount, and one per Airflow component, each in Airflow's own
namespace, as the official Helm chart runs them); without it the manager is refused with the remedy."""

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
from tests.support.kube_fixture import Kube

pytestmark = [pytest.mark.kubernetes, pytest.mark.slow]
K8S = Path(__file__).resolve().parents[3] / "k8s"
RBAC = K8S / "base" / "rbac.yaml"
OVERLAYS = ("gpu", "cpu-demo")
AIRFLOW_NAMESPACE = "airflow"  # what the overlays' subjects name; a test namespace stands in for it


def overlay_subjects(overlay: str) -> list[dict[str, Any]]:
    """The RoleBinding subjects an overlay sets (its JSON patch of ``/subjects``)."""
    (op,) = yaml.safe_load((K8S / "overlays" / overlay / "airflow-service-accounts.yaml").read_text())
    assert op["op"] == "replace" and op["path"] == "/subjects", op
    subjects: list[dict[str, Any]] = op["value"]
    return subjects


def rbac_docs(subjects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """k8s/base/rbac.yaml with the RoleBinding's subjects set as an overlay sets them."""
    docs = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    (binding,) = [d for d in docs if d["kind"] == "RoleBinding"]
    binding["subjects"] = subjects
    return docs


def wait_allowed(api: client.ApiClient, ns: str) -> None:
    review = {"spec": {"resourceAttributes": {"namespace": ns, "verb": "create", "group": "apps",
                                              "resource": "deployments"}}}  # fmt: skip
    for _ in range(100):  # the authorizer sees a new binding within moments
        if client.AuthorizationV1Api(api).create_self_subject_access_review(review).status.allowed:
            return
        time.sleep(0.1)


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


def test_the_overlays_bind_the_role_to_each_airflow_component() -> None:
    subjects = {o: overlay_subjects(o) for o in OVERLAYS}
    assert subjects["gpu"] == subjects["cpu-demo"]
    names = {(s["kind"], s["name"], s.get("namespace")) for s in subjects["gpu"]}
    assert ("ServiceAccount", "batchinfer-airflow", None) in names  # the reaper's, in the pools' namespace
    helm = {f"airflow-{c}" for c in ("worker", "triggerer", "api-server", "scheduler")}
    assert {n for k, n, ns in names if ns == AIRFLOW_NAMESPACE} == helm
    (base,) = [d for d in yaml.safe_load_all(RBAC.read_text()) if d and d["kind"] == "RoleBinding"]
    assert base["subjects"] == [{"kind": "ServiceAccount", "name": "batchinfer-airflow"}]


def test_the_role_in_k8s_is_enough_for_the_whole_pool_lifecycle(kube: Kube, tmp_path: Path) -> None:
    """Each identity the overlay binds does its own part, as a deployment of the Helm chart does: the
    worker sets the pool up and tears it down, the triggerer waits for ready workers and reads the
    token, the api-server's Test button does the same, the scheduler (LocalExecutor tasks) releases
    a lease, the reaper scales to zero. And every one of them is allowed every rule of the Role."""
    ns, airflow_ns = kube.namespace(), kube.namespace()
    subjects = [
        {**s, "namespace": airflow_ns} if s.get("namespace") == AIRFLOW_NAMESPACE else s
        for s in overlay_subjects("gpu")
    ]
    for doc in rbac_docs(subjects):
        utils.create_from_dict(kube.api, doc, namespace=ns)
    apis = {
        s["name"]: as_service_account(kube, s.get("namespace", ns), s["name"], tmp_path) for s in subjects
    }
    assert len(apis) >= 5
    role = client.RbacAuthorizationV1Api(kube.api).read_namespaced_role("batchinfer-pool-manager", ns)
    wanted = [(verb, group, resource) for rule in role.rules for group in rule.api_groups
              for resource in rule.resources for verb in rule.verbs]  # fmt: skip
    assert len(wanted) >= 15
    for name, api in apis.items():
        wait_allowed(api, ns)
        for verb, group, resource in wanted:
            attributes = {"namespace": ns, "verb": verb, "group": group, "resource": resource}
            review = client.AuthorizationV1Api(api).create_self_subject_access_review(
                {"spec": {"resourceAttributes": attributes}}
            )
            assert review.status.allowed, (name, attributes)

    def pool(component: str) -> KubernetesPool:
        return KubernetesPool(apis[component], "pool", ns)

    sp = spec(ns, tmp_path)
    assert pool("airflow-worker").ensure(sp) == "created"  # pool_setup, on a Celery worker
    pool("airflow-worker").acquire("run", 1)
    urls = pool("airflow-triggerer").wait_ready(1, timeout_s=90)  # the ready trigger
    assert len(urls) == 1 and pool("airflow-triggerer").token()
    assert pool("airflow-api-server").endpoints() == urls and pool("airflow-api-server").token()  # Test
    assert pool("airflow-api-server").status()["ready"] == 1
    assert pool("airflow-scheduler").release("run") == 1  # a LocalExecutor task's teardown
    assert pool("batchinfer-airflow").scale_to_zero() == 0  # the reaper
    pool("airflow-worker").delete()
    assert not client.AppsV1Api(kube.api).list_namespaced_deployment(ns).items

    # ... and no more, for any of them
    for name, api in apis.items():
        assert_no_more(api, ns, ("default", airflow_ns), who=name)


def assert_no_more(api: client.ApiClient, ns: str, others: tuple[str, ...], who: str) -> None:
    """No listing Secrets, deleting pods, nodes, RBAC, or another namespace (Airflow's own included)."""
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    assert forbidden(lambda: core.list_namespaced_secret(ns)), who
    assert forbidden(lambda: core.delete_collection_namespaced_pod(ns)), who
    assert forbidden(lambda: core.list_node()), who
    for other in others:
        assert forbidden(lambda: apps.list_namespaced_deployment(other)), (who, other)  # noqa: B023
    assert forbidden(
        lambda: client.RbacAuthorizationV1Api(api).create_namespaced_role(
            ns, {"metadata": {"name": "x"}, "rules": []}
        )
    ), who


def test_without_the_role_the_manager_is_refused_with_the_remedy(kube: Kube, tmp_path: Path) -> None:
    ns = kube.namespace()
    api = as_service_account(kube, ns, "nobody", tmp_path)
    with pytest.raises(ConfigError, match=r"refused to read secrets .*k8s/base/rbac\.yaml"):
        KubernetesPool(api, "pool", ns).ensure(spec(ns, tmp_path))
    with pytest.raises(ConfigError, match=r"refused to read deployments"):
        KubernetesPool(api, "pool", ns).acquire("run", 1)
