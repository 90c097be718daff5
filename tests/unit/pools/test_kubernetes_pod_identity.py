"""A Kubernetes pool's workers run as the ServiceAccount its spec names (``service_account``: the
identity a cloud gives storage access to, IRSA or Workload Identity) and pull their image with the
Secrets it names (``image_pull_secrets``), still with no Kubernetes API token. Trigger params choose
them only within the deployment's limits (tests/component/triggers/test_trigger_limits.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.pools.kubernetes.objects import template_patch, worker_deployment
from airflow_batchinfer.pools.kubernetes.spec import KubernetesPoolSpec

pytestmark = pytest.mark.security

PREFIXES = ("s3://bucket/runs/",)


def pod_spec(spec: KubernetesPoolSpec) -> dict[str, Any]:
    pod: dict[str, Any] = worker_deployment(spec)["spec"]["template"]["spec"]
    return pod


def test_service_account_and_pull_secrets_reach_the_pod_without_an_api_token() -> None:
    spec = KubernetesPoolSpec(
        allowed_prefixes=PREFIXES, service_account="batchinfer-s3-reader",
        image_pull_secrets=("regcred", "mirror.example.com"),
    )  # fmt: skip
    pod = pod_spec(spec)
    assert pod["serviceAccountName"] == "batchinfer-s3-reader"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror.example.com"}]
    assert pod["automountServiceAccountToken"] is False  # the workers never call the API
    # unset: neither is in the pod spec (the namespace's default ServiceAccount, no pull Secrets)
    plain = pod_spec(KubernetesPoolSpec(allowed_prefixes=PREFIXES))
    assert "serviceAccountName" not in plain and "imagePullSecrets" not in plain
    assert "serviceAccountName" not in pod_spec(dataclasses.replace(spec, service_account=""))


def test_from_a_dict_as_the_kubernetes_param_gives_them() -> None:
    spec = KubernetesPoolSpec.from_dict(
        {"allowed_prefixes": list(PREFIXES), "service_account": "sa", "image_pull_secrets": ["regcred"]}
    )
    assert spec.service_account == "sa" and spec.image_pull_secrets == ("regcred",)
    with pytest.raises(ConfigError, match=r"image_pull_secrets: expected a list"):
        KubernetesPoolSpec.from_dict({"allowed_prefixes": list(PREFIXES), "image_pull_secrets": "regcred"})
    with pytest.raises(ConfigError, match=r"image_pull_secrets: expected a list of Secret names"):
        KubernetesPoolSpec(allowed_prefixes=PREFIXES, image_pull_secrets="regcred")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["Admin", "a_b", "-sa", "sa-", "a b", "a/b", "x" * 254, 5])
def test_names_that_kubernetes_would_refuse_are_refused_when_the_spec_is_built(name: Any) -> None:
    with pytest.raises(ConfigError, match=r"service_account: .* is not a ServiceAccount name"):
        KubernetesPoolSpec(allowed_prefixes=PREFIXES, service_account=name)
    with pytest.raises(ConfigError, match=r"image_pull_secrets: .* is not a Secret name"):
        KubernetesPoolSpec(allowed_prefixes=PREFIXES, image_pull_secrets=("ok", name))


def test_they_are_in_the_spec_key_and_pools_from_before_keep_theirs() -> None:
    kw: dict[str, Any] = {"name": "llm", "namespace": "batch", "image": "registry.example/w:1.0",
                          "allowed_prefixes": PREFIXES, "storage_secret": "s3"}  # fmt: skip
    base = KubernetesPoolSpec(**kw)
    # the key this spec had before the fields existed: upgrading must not replace a pool's pods
    assert base.key() == "b88f585e57d9dee6", "a new field's default changed the key of existing pools"
    assert KubernetesPoolSpec(**kw, service_account="", image_pull_secrets=()).key() == base.key()
    keys = {
        base.key(),
        KubernetesPoolSpec(**kw, service_account="a").key(),
        KubernetesPoolSpec(**kw, service_account="b").key(),
        KubernetesPoolSpec(**kw, image_pull_secrets=("regcred",)).key(),
    }
    assert len(keys) == 4  # another identity or pull Secret replaces the pods


def test_the_update_patch_removes_what_a_spec_no_longer_sets() -> None:
    """An update is a JSON merge patch of the pod template, which keeps every key it does not name: a
    pool that drops its service account (or node selector, tolerations, pull Secrets) names them as
    null, or its pods would keep the old identity."""
    plain = template_patch(KubernetesPoolSpec(allowed_prefixes=PREFIXES, gpus=0))["spec"]
    for key in ("serviceAccountName", "serviceAccount", "imagePullSecrets", "nodeSelector", "tolerations"):
        assert key in plain and plain[key] is None, key
    full = template_patch(
        KubernetesPoolSpec(allowed_prefixes=PREFIXES, service_account="sa", image_pull_secrets=("r",))
    )["spec"]
    assert full["serviceAccountName"] == "sa" and full["imagePullSecrets"] == [{"name": "r"}]
    assert full["serviceAccount"] is None  # the API's old alias: it must not bring back another one
