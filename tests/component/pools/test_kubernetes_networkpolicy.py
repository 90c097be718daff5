"""Only Airflow's pods reach the workers' RPC port: k8s/ ships a NetworkPolicy that selects every worker
pod and admits ingress to port 8000 from pods that match BOTH a namespace selector and a pod selector
(one peer; two peers would admit either)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_batchinfer.pools.kubernetes.objects import selector
from tests.support.manifests import K8S, base_docs, rendered

pytestmark = pytest.mark.security

pytest.importorskip("kubernetes", reason="needs the kubernetes extra")


def policies(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == "NetworkPolicy"]


def check_admits_only_airflow_to_the_rpc_port(policy: dict[str, Any], deployment: dict[str, Any]) -> None:
    spec = policy["spec"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    chosen = spec["podSelector"]["matchLabels"]
    assert chosen and chosen.items() <= pod_labels.items(), "the policy must select the worker pods"
    assert "matchExpressions" not in spec["podSelector"]
    assert chosen.items() <= selector("any-other-pool").items(), "and the pods of every pool in the namespace"
    assert spec["policyTypes"] == ["Ingress"]
    (rule,) = spec["ingress"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    (port,) = rule["ports"]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert port.get("protocol", "TCP") == "TCP"
    assert named.get(port["port"], port["port"]) == 8000
    assert rule["from"], "an empty `from` admits everyone"
    for peer in rule["from"]:
        # namespace AND pod labels in the same peer; neither alone, no ipBlock
        assert set(peer) == {"namespaceSelector", "podSelector"}
        for selects in (peer["namespaceSelector"], peer["podSelector"]):  # {} would select everything
            assert selects.get("matchLabels") or selects.get("matchExpressions")


def test_base_has_one_policy_for_the_worker_pods() -> None:
    docs = base_docs()
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (policy,) = policies(docs)
    check_admits_only_airflow_to_the_rpc_port(policy, deployment)
    kustomization = yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text())
    assert "networkpolicy.yaml" in kustomization["resources"]


def test_every_overlay_renders_exactly_one_policy_selecting_its_workers(tmp_path: Path) -> None:
    out = rendered(tmp_path)
    if not out:
        pytest.skip("kubectl (its kustomize) is not on PATH: the overlays are not rendered here")
    for overlay, docs in out.items():
        (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
        found = policies(docs)
        assert len(found) == 1, overlay
        assert found[0]["metadata"].get("namespace") == deployment["metadata"].get("namespace")
        check_admits_only_airflow_to_the_rpc_port(found[0], deployment)
