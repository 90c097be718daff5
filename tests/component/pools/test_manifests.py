"""k8s/: generated from the pool spec, valid against the Kubernetes schemas (strict, offline), and
accepted by a real API server (server-side dry run)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.kube_fixture import Kube
from tests.support.manifests import K8S, ROOT, base_docs, load_all, rendered

pytest.importorskip("kubernetes", reason="needs the kubernetes extra")
BIN = str(Path(sys.executable).parent / "batchinfer")


def base_spec_args() -> list[str]:
    """``K8S_BASE_SPEC`` from the Makefile: what ``make manifests`` generates k8s/base/worker.yaml with."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    return shlex.split(re.search(r"^K8S_BASE_SPEC := (.*)$", text, re.M).group(1))  # type: ignore[union-attr]


def identity_docs() -> list[dict[str, Any]]:
    """A pool whose workers run as their own ServiceAccount and pull from a private registry, as
    ``batchinfer pool manifests`` prints it (the objects the pool manager creates for that spec)."""
    flags = ["--service-account", "batchinfer-s3", "--image-pull-secret", "regcred",
             "--image-pull-secret", "mirror.example.com"]  # fmt: skip
    out = subprocess.run(
        [BIN, "pool", "manifests", *base_spec_args(), *flags], capture_output=True, text=True, check=True
    )
    docs = load_all(out.stdout)
    pod = docs[0]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "batchinfer-s3" and pod["automountServiceAccountToken"] is False
    assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror.example.com"}]
    return docs


def test_base_worker_yaml_is_what_the_pool_manager_creates() -> None:
    out = subprocess.run(
        [BIN, "pool", "manifests", *base_spec_args()], capture_output=True, text=True, check=True
    )
    assert (K8S / "base" / "worker.yaml").read_text() == out.stdout, (
        "k8s/base/worker.yaml is stale: make manifests"
    )


def test_base_and_overlays_pass_strict_schema_validation(tmp_path: Path) -> None:
    import kubernetes_validate

    docs = base_docs() + identity_docs() + [d for objs in rendered(tmp_path).values() for d in objs]
    kinds = {
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "CronJob",
        "NetworkPolicy",
    }
    assert {d["kind"] for d in docs} >= kinds
    for version in ("1.25.0", kubernetes_validate.latest_version()):
        for doc in docs:
            kubernetes_validate.validate(doc, version, strict=True)  # raises on any unknown or bad field
    bad = load_all((K8S / "base" / "worker.yaml").read_text())[0]
    bad["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}  # a typo must not pass
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.25.0", strict=True)


def test_overlays_render_what_they_promise(tmp_path: Path) -> None:
    out = rendered(tmp_path)
    if not out:
        pytest.skip("kubectl (its kustomize) is not on PATH: the overlays are not rendered here")
    by_kind = {o: {d["kind"]: d for d in docs} for o, docs in out.items()}
    for overlay, kinds in by_kind.items():
        assert all(d["metadata"].get("namespace", "batchinfer") == "batchinfer" for d in out[overlay])
        assert kinds["Secret"]["metadata"]["name"] == "batchinfer-token"  # read by name by the pool manager
        env = {
            e["name"]: e.get("value")
            for e in kinds["Deployment"]["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        assert env["BATCHINFER_WORKER_HOST"] == "$(POD_IP)"
        # one NetworkPolicy, over the workers' pods (tests/component/pools/test_kubernetes_networkpolicy.py)
        (policy,) = [d for d in out[overlay] if d["kind"] == "NetworkPolicy"]
        workers = kinds["Deployment"]["spec"]["template"]["metadata"]["labels"]
        assert policy["spec"]["podSelector"]["matchLabels"].items() <= workers.items()
        assert policy["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 8000}]
    gpu = by_kind["gpu"]["Deployment"]["spec"]["template"]["spec"]
    assert gpu["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert gpu["containers"][0]["image"].startswith("registry.example.com/")
    assert by_kind["gpu"]["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0][
        "image"
    ].startswith("registry.example.com/")  # the reaper runs the same image
    for kinds in by_kind.values():  # the Role is bound to the reaper and to Airflow's components
        subjects = {(s["name"], s["namespace"]) for s in kinds["RoleBinding"]["subjects"]}
        assert ("batchinfer-airflow", "batchinfer") in subjects  # the reaper's, in the pools' namespace
        assert {n for n, ns in subjects if ns == "airflow"} >= {"airflow-worker", "airflow-triggerer"}
        reaper = kinds["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        assert reaper["serviceAccountName"] == "batchinfer-airflow"
    # model-cache: the gpu workers with the node's cache mounted and named, and the stager filling it
    cached = by_kind["model-cache"]["Deployment"]["spec"]["template"]["spec"]
    cache_dir = {"path": "/var/cache/batchinfer-models", "type": "DirectoryOrCreate"}
    assert {"name": "model-cache", "hostPath": cache_dir} in cached["volumes"]
    worker = cached["containers"][0]
    assert {"name": "model-cache", "mountPath": "/model-cache", "readOnly": True} in worker["volumeMounts"]
    assert {"name": "BATCHINFER_WORKER_MODEL_CACHE_DIR", "value": "/model-cache"} in worker["env"]
    stager = by_kind["model-cache"]["DaemonSet"]["spec"]["template"]["spec"]
    assert {"name": "model-cache", "hostPath": cache_dir} in stager["volumes"]
    model = {e["name"]: e.get("value") for e in worker["env"]}["BATCHINFER_WORKER_MODEL"]
    assert {"name": "MODEL", "value": model} in stager["initContainers"][0]["env"]  # the same model
    assert stager["initContainers"][0]["image"] == worker["image"]
    cpu = by_kind["cpu-demo"]["Deployment"]["spec"]["template"]["spec"]
    assert "nvidia.com/gpu" not in str(cpu) and "dshm" not in str(cpu)
    env = {e["name"]: e.get("value") for e in cpu["containers"][0]["env"]}
    assert env["BATCHINFER_WORKER_ENGINE"] == "transformers"


@pytest.mark.kubernetes
def test_server_side_dry_run_accepts_every_object(kube_api: Kube, tmp_path: Path) -> None:
    """Everything the server serves passes its validation and admission; what it cannot serve (APIs
    newer than the server, e.g. 1.20) is named, and is exactly that. Needs only an API server."""
    from kubernetes import client, dynamic
    from kubernetes.dynamic.exceptions import ResourceNotFoundError

    kube = kube_api
    dyn = dynamic.DynamicClient(kube.api)
    ns = kube.namespace()
    minor = int(re.match(r"\d+", client.VersionApi(kube.api).get_code().minor).group())  # type: ignore[union-attr]
    docs = [d for objs in rendered(tmp_path).values() for d in objs] or base_docs()
    docs += identity_docs()
    unserved, accepted = set(), []
    for doc in docs:
        try:
            resource = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        except ResourceNotFoundError:
            unserved.add(f"{doc['apiVersion']}/{doc['kind']}")
            continue
        if resource.namespaced:
            doc = {**doc, "metadata": {**doc["metadata"], "namespace": ns}}
            resource.create(body=doc, namespace=ns, dry_run="All")
        else:
            resource.create(body=doc, dry_run="All")
        accepted.append(doc["kind"])
    assert len(accepted) >= 6 and "NetworkPolicy" in accepted
    ga_in_1_21 = {"policy/v1/PodDisruptionBudget", "batch/v1/CronJob"}
    assert unserved == (ga_in_1_21 if minor < 21 else set())
