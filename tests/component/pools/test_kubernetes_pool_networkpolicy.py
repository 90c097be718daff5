"""Issue 22, item 8: every pool the pool manager makes has a NetworkPolicy of its own: ingress to its
workers' RPC port only from Airflow's pods (``rpc_from``, by default the Helm chart's components that
call workers, as k8s/base selects them), in Airflow's namespace when that is another
(``rpc_from_namespace``: one peer with both selectors). ``batchinfer pool manifests`` prints it
with the pool's other objects. The manager's create and delete are in
tests/component/pools/test_pool_manager.py (a real API server).

Who may call is the deployment's to name, never a trigger's: the pool's ``batchinfer_pool``
connection (extra ``rpc_from``, ``rpc_from_namespace``), else ``[batchinfer]`` (the same keys), else
the pool's default; ``pool_setup`` builds the spec from them, and a malformed one fails it naming
where it was read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.pools.kubernetes.objects import network_policy, pool_objects, selector
from airflow_batchinfer.pools.kubernetes.spec import KubernetesPoolSpec

pytestmark = pytest.mark.security

BASE_POLICY = Path(__file__).resolve().parents[3] / "k8s" / "base" / "networkpolicy.yaml"


def spec(**kw: Any) -> KubernetesPoolSpec:
    return KubernetesPoolSpec(**{"name": "gpu", "namespace": "pools", "allowed_prefixes": ("s3://b/",), **kw})


def test_the_policy_admits_only_airflows_pods_to_this_pools_rpc_port() -> None:
    policy = network_policy(spec(port=8123))
    assert policy["metadata"] == {**policy["metadata"], "name": "gpu-rpc", "namespace": "pools"}
    body = policy["spec"]
    assert body["podSelector"] == {"matchLabels": selector("gpu")}  # this pool's pods, not another's
    assert body["policyTypes"] == ["Ingress"]
    (rule,) = body["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8123}]
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}  # Airflow in the pools' namespace: no namespace selector
    # the same pods as k8s/base's policy selects: the Helm chart's components that call workers
    base = yaml.safe_load(BASE_POLICY.read_text())["spec"]["ingress"][0]["from"][0]["podSelector"]
    assert peer["podSelector"] == base


def test_airflow_in_another_namespace_is_one_peer_with_both_selectors() -> None:
    selects = {"matchLabels": {"release": "airflow-prod"}}
    (peer,) = network_policy(spec(rpc_from=selects, rpc_from_namespace="airflow"))["spec"]["ingress"][0][
        "from"
    ]
    namespace = {"matchLabels": {"kubernetes.io/metadata.name": "airflow"}}
    assert peer == {"podSelector": selects, "namespaceSelector": namespace}
    same = network_policy(spec(rpc_from_namespace="pools"))["spec"]["ingress"][0]["from"][0]
    assert set(same) == {"podSelector"}


@pytest.mark.parametrize(
    ("rpc_from", "match"),
    [({}, "empty selector would admit every pod"), ({"matchLabels": {}}, "empty selector"),
     ({"ipBlock": {"cidr": "0.0.0.0/0"}}, "label selector"), ({"matchLabels": {"tier": 1}}, "matchLabels"),
     ({"matchExpressions": [{"key": "a", "operator": "Near"}]}, "matchExpressions"),
     ("tier=airflow", "label")],
)  # fmt: skip
def test_a_selector_that_admits_everyone_or_is_malformed_is_refused(rpc_from: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        spec(rpc_from=rpc_from)
    with pytest.raises(ConfigError, match="rpc_from_namespace"):
        spec(rpc_from_namespace="Not A Namespace")


def test_who_may_call_is_not_a_trigger_setting_and_changes_no_worker() -> None:
    from airflow_batchinfer.pools.kubernetes.spec import TRIGGER_KEYS

    assert not {"rpc_from", "rpc_from_namespace"} & TRIGGER_KEYS
    assert spec(rpc_from_namespace="airflow").key() == spec().key()  # the policy is updated, pods stay


def test_the_pool_objects_include_it_and_pass_strict_schema_validation() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    objs = pool_objects(spec(rpc_from_namespace="airflow"))
    (policy,) = [o for o in objs if o["kind"] == "NetworkPolicy"]
    assert policy == network_policy(spec(rpc_from_namespace="airflow"))
    for version in ("1.25.0", kubernetes_validate.latest_version()):
        kubernetes_validate.validate(policy, version, strict=True)
    assert "NetworkPolicy" not in {o["kind"] for o in pool_objects(spec(), network=False)}


def test_pool_manifests_prints_it() -> None:
    pytest.importorskip("kubernetes", reason="needs the kubernetes extra")
    bin_ = str(Path(sys.executable).parent / "batchinfer")
    args = [bin_, "pool", "manifests", "--backend", "kubernetes", "--name", "gpu", "--namespace", "pools",
            "--allow-prefix", "s3://b/", "--rpc-from", '{"matchLabels": {"release": "af"}}',
            "--rpc-from-namespace", "airflow"]  # fmt: skip
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    (policy,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "NetworkPolicy"]
    (peer,) = policy["spec"]["ingress"][0]["from"]
    assert peer["podSelector"] == {"matchLabels": {"release": "af"}}
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "airflow"}
    plain = subprocess.run([*args[:11], "--no-network-policy"], capture_output=True, text=True, check=True)
    assert "NetworkPolicy" not in plain.stdout


# ------------------------------------------- where a deployment names the peers: the connection, the config
class Conn:
    """A ``batchinfer_pool`` connection of the kubernetes backend (the fields a pool reads)."""

    def __init__(self, conn_id: str, **extra: Any) -> None:
        self.conn_id, self.host, self.password = conn_id, None, None
        self.extra_dejson = {"backend": "kubernetes", "pool": "gpu", "namespace": "pools", **extra}


AIRFLOW = {"release": "airflow-prod"}


def _spec_from_setup(
    monkeypatch: pytest.MonkeyPatch, worker_pool: str, conn: Conn | None
) -> KubernetesPoolSpec:
    """The spec ``pool_setup`` builds for ``worker_pool`` (its connection ``conn``): the pool is the
    real one ``open_pool`` returns, its API calls recorded instead of made."""
    pytest.importorskip("airflow", reason="needs the airflow extra")
    pytest.importorskip("kubernetes", reason="needs the kubernetes extra")
    from airflow_batchinfer.operators.pool import PoolSetupOperator
    from airflow_batchinfer.pools.backends import open_backend
    from airflow_batchinfer.pools.kubernetes import KubernetesPool
    from airflow_batchinfer.pools.ref import PoolRef

    built: list[KubernetesPoolSpec] = []
    monkeypatch.setattr(
        KubernetesPool, "ensure", lambda self, spec, lease_id=None: built.append(spec) or "created"
    )
    monkeypatch.setattr(KubernetesPool, "acquire", lambda self, lease, replicas, ttl_s=0.0: replicas)
    pool = open_backend(PoolRef.parse(worker_pool), conn, kubernetes_api=lambda conn_id: object())
    op = PoolSetupOperator(task_id="pool_setup", worker_pool=worker_pool, allowed_prefixes=["s3://b/"])
    op._kubernetes_up(pool, 1, {"dag": SimpleNamespace(dag_id="d"), "run_id": "r1"})  # type: ignore[arg-type]
    (spec,) = built
    return spec


def _peer(spec: KubernetesPoolSpec) -> dict[str, Any]:
    (peer,) = network_policy(spec)["spec"]["ingress"][0]["from"]
    return peer  # type: ignore[no-any-return]


def test_the_pool_connections_extra_names_who_may_call_over_the_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIRFLOW__BATCHINFER__RPC_FROM", '{"matchLabels": {"release": "from-config"}}')
    monkeypatch.setenv("AIRFLOW__BATCHINFER__RPC_FROM_NAMESPACE", "config-ns")
    conn = Conn("gpu_pool", rpc_from=json.dumps({"matchLabels": AIRFLOW}), rpc_from_namespace="airflow")
    spec = _spec_from_setup(monkeypatch, "gpu_pool", conn)
    assert (spec.rpc_from, spec.rpc_from_namespace) == ({"matchLabels": AIRFLOW}, "airflow")
    namespace = {"matchLabels": {"kubernetes.io/metadata.name": "airflow"}}
    assert _peer(spec) == {"podSelector": {"matchLabels": AIRFLOW}, "namespaceSelector": namespace}
    # an extra written as an object (the connection's JSON) reads the same
    as_object = Conn("gpu_pool", rpc_from={"matchLabels": AIRFLOW}, rpc_from_namespace="airflow")
    assert _spec_from_setup(monkeypatch, "gpu_pool", as_object).rpc_from == {"matchLabels": AIRFLOW}


def test_the_config_names_them_where_the_connection_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__BATCHINFER__RPC_FROM", json.dumps({"matchLabels": AIRFLOW}))
    monkeypatch.setenv("AIRFLOW__BATCHINFER__RPC_FROM_NAMESPACE", "airflow")
    plain = _spec_from_setup(monkeypatch, "kubernetes://pools/gpu", None)  # no connection at all
    assert (plain.rpc_from, plain.rpc_from_namespace) == ({"matchLabels": AIRFLOW}, "airflow")
    # each setting on its own: the connection's namespace, the config's selector
    mixed = _spec_from_setup(monkeypatch, "gpu_pool", Conn("gpu_pool", rpc_from_namespace="af-conn"))
    assert (mixed.rpc_from, mixed.rpc_from_namespace) == ({"matchLabels": AIRFLOW}, "af-conn")


def test_the_pools_default_comes_last(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_batchinfer.pools.kubernetes.spec import DEFAULT_RPC_FROM

    for env in ("AIRFLOW__BATCHINFER__RPC_FROM", "AIRFLOW__BATCHINFER__RPC_FROM_NAMESPACE"):
        monkeypatch.delenv(env, raising=False)
    for ref, conn in (("gpu_pool", Conn("gpu_pool", rpc_from="", rpc_from_namespace=None)),
                      ("kubernetes://pools/gpu", None)):  # fmt: skip
        spec = _spec_from_setup(monkeypatch, ref, conn)
        assert (spec.rpc_from, spec.rpc_from_namespace) == (DEFAULT_RPC_FROM, None)
        assert _peer(spec) == {"podSelector": DEFAULT_RPC_FROM}


@pytest.mark.parametrize(
    ("extra", "match"),
    [({"rpc_from": "{not json"}, "rpc_from is not JSON"), ({"rpc_from": "{}"}, "empty selector"),
     ({"rpc_from": {"ipBlock": {"cidr": "0.0.0.0/0"}}}, "label selector"),
     ({"rpc_from_namespace": "Not A Namespace"}, "rpc_from_namespace")],
)  # fmt: skip
def test_a_malformed_selector_in_the_extra_fails_the_setup_naming_the_connection(
    monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any], match: str
) -> None:
    pytest.importorskip("airflow", reason="needs the airflow extra")
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_batchinfer.operators import pool as pool_ops
    from airflow_batchinfer.pools.backends import open_backend
    from airflow_batchinfer.pools.ref import PoolRef

    def no_api(conn_id: str | None) -> Any:
        pytest.fail("the connection's extra is refused before the pool opens an API client")

    conn = Conn("gpu_pool", **extra)
    monkeypatch.setattr(
        pool_ops, "open_pool", lambda ref: open_backend(PoolRef.parse(ref), conn, kubernetes_api=no_api)
    )
    op = pool_ops.PoolSetupOperator(
        task_id="pool_setup", worker_pool="gpu_pool", allowed_prefixes=["s3://b/"]
    )
    with pytest.raises(AirflowFailException, match=rf"connection 'gpu_pool' extra: .*{match}"):
        op.execute({"dag": SimpleNamespace(dag_id="d"), "run_id": "r1"})  # type: ignore[arg-type]


def test_a_malformed_selector_in_the_config_is_refused_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("airflow", reason="needs the airflow extra")
    monkeypatch.setenv("AIRFLOW__BATCHINFER__RPC_FROM", '{"matchLabels": {}}')
    with pytest.raises(ConfigError, match=r"\[batchinfer\]: rpc_from: .*empty selector"):
        _spec_from_setup(monkeypatch, "kubernetes://pools/gpu", None)


def test_the_connection_form_and_the_config_section_offer_both_settings() -> None:
    from airflow_batchinfer.get_provider_info import get_provider_info

    info = get_provider_info()
    (conn,) = info["connection-types"]
    options = info["config"]["batchinfer"]["options"]
    for name in ("rpc_from", "rpc_from_namespace"):
        assert "kubernetes backend" in conn["conn-fields"][name]["description"]
        assert options[name]["default"] is None and options[name]["type"] == "string"
