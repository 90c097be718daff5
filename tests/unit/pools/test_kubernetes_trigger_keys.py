"""``TRIGGER_KEYS``: the Kubernetes pool settings a trigger's ``kubernetes`` param may set. Pod
placement and resources only; never what the pool is (name, namespace), what it runs (engine, model,
engine options) or what it lets jobs do (the allow-lists)."""

from __future__ import annotations

import dataclasses

import pytest

from airflow_batchinfer.pools.kubernetes.spec import TRIGGER_KEYS, KubernetesPoolSpec

pytestmark = pytest.mark.security

NEVER_FROM_A_TRIGGER = {
    "name", "namespace", "engine", "model", "engine_options", "replicas", "concurrency",
    "target_batch_tokens", "allowed_prefixes", "allowed_callables", "allowed_adapters", "idle_ttl_s",
    "rpc_from", "rpc_from_namespace",  # who may call the workers: the NetworkPolicy's peers
    "model_cache",  # a host path or claim mounted in the pods: the DAG's, never a trigger's
}  # fmt: skip


def test_trigger_keys_are_pod_settings_only() -> None:
    fields = {f.name for f in dataclasses.fields(KubernetesPoolSpec)}
    assert isinstance(TRIGGER_KEYS, frozenset) and fields >= TRIGGER_KEYS
    assert not TRIGGER_KEYS & NEVER_FROM_A_TRIGGER
    # every field is decided one way or the other: a new field must be placed on purpose
    assert fields == TRIGGER_KEYS | NEVER_FROM_A_TRIGGER
