"""A Kubernetes pool carries its callable-judge allow-list to the workers
(``BATCHINFER_WORKER_ALLOW_CALLABLE``), and the list is part of what the workers run (the spec key)."""

from __future__ import annotations

import pytest

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.pools.kubernetes.objects import worker_deployment
from airflow_batchinfer.pools.kubernetes.spec import KubernetesPoolSpec

pytestmark = pytest.mark.security

PREFIXES = ("s3://bucket/runs/",)


def env_of(spec: KubernetesPoolSpec) -> dict[str, str | None]:
    container = worker_deployment(spec)["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in container["env"]}


def test_allowed_callables_reach_the_workers_as_one_variable() -> None:
    spec = KubernetesPoolSpec(allowed_prefixes=PREFIXES, allowed_callables=("my_pkg.checks:is_good", "b.c:d"))
    assert env_of(spec)["BATCHINFER_WORKER_ALLOW_CALLABLE"] == "my_pkg.checks:is_good,b.c:d"
    # none allowed: set, empty (the worker refuses callable judges), so no storage Secret key can set it
    assert env_of(KubernetesPoolSpec(allowed_prefixes=PREFIXES))["BATCHINFER_WORKER_ALLOW_CALLABLE"] == ""


def test_allowed_callables_change_the_spec_key() -> None:
    base = KubernetesPoolSpec(allowed_prefixes=PREFIXES)
    allowing = KubernetesPoolSpec(allowed_prefixes=PREFIXES, allowed_callables=("m:f",))
    assert base.key() != allowing.key()  # a pool allowing other callables gets its pods replaced
    assert allowing.key() != KubernetesPoolSpec(allowed_prefixes=PREFIXES, allowed_callables=("m:g",)).key()


def test_allowed_callables_from_a_dict() -> None:
    spec = KubernetesPoolSpec.from_dict({"allowed_prefixes": list(PREFIXES), "allowed_callables": ["m:f"]})
    assert spec.allowed_callables == ("m:f",)
    assert KubernetesPoolSpec.from_dict({"allowed_prefixes": list(PREFIXES)}).allowed_callables == ()


@pytest.mark.parametrize("entry", ["", "a:b,c:d", "a: b", "a:b\n"])
def test_an_entry_cannot_smuggle_a_second_one(entry: str) -> None:
    """The variable is comma-separated: an entry with a comma would allow two."""
    with pytest.raises(ConfigError, match="allowed_callables"):
        KubernetesPoolSpec(allowed_prefixes=PREFIXES, allowed_callables=(entry,))
