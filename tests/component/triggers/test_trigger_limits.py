"""Issue 14, item 1 and 3: what a DAG trigger may choose. The decision (``limits.refusals``) is pure:
these tests feed it the params an attacker would type into the trigger form."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.pools.kubernetes.spec import DEFAULT_IMAGE
from airflow_batchinfer.spec.limit_settings import matches
from airflow_batchinfer.spec.limits import TriggerLimits, callable_targets, implied_by, refusals

pytestmark = pytest.mark.security

DEFAULTS = {
    "input": "/data/demo/input.jsonl",
    "output_root": "/data/runs",
    "worker_pool": "local://batchinfer",
    "judge": {"type": "expected_answer"},
    "kubernetes": {},
}
DAG = implied_by(DEFAULTS)


def test_the_defaults_are_allowed_as_written() -> None:
    assert refusals(DEFAULTS, DAG, run_root="/data/runs/run-1") == []


def test_input_outside_the_allowed_prefixes_is_refused() -> None:
    (why,) = refusals({**DEFAULTS, "input": "/etc/passwd"}, DAG)
    assert "input '/etc/passwd' is outside" in why and "allowed_input_prefixes" in why


def test_a_run_name_cannot_leave_the_output_root() -> None:
    assert refusals(DEFAULTS, DAG, run_root="/data/runs/../../etc/cron.d") != []
    assert refusals({**DEFAULTS, "output_root": "/data/runs-other"}, DAG) != []  # a prefix is a directory


def test_a_symlink_inside_an_allowed_prefix_does_not_lead_out(tmp_path: Path) -> None:
    allowed = tmp_path / "data"
    allowed.mkdir()
    os.symlink("/etc", allowed / "etc")
    limits = TriggerLimits(allowed_input_prefixes=(str(allowed),))
    assert refusals({"input": str(allowed / "ok.jsonl")}, limits) == []
    assert refusals({"input": str(allowed / "etc" / "passwd")}, limits) != []


def test_raw_pool_references_are_refused_unless_the_dag_allows_them() -> None:
    attack = {**DEFAULTS, "worker_pool": "kubernetes://kube-system/x?kubernetes_conn_id=admin_kube"}
    (why,) = refusals(attack, DAG)
    assert "kubernetes://kube-system/x?kubernetes_conn_id=admin_kube" in why
    assert refusals({**DEFAULTS, "worker_pool": "local://other"}, DAG) != []
    # a batchinfer_pool connection pins its own pool (the caller checked its type)
    assert refusals({**DEFAULTS, "worker_pool": "gpu_pool"}, DAG, pool_is_connection=True) == []
    assert refusals({**DEFAULTS, "worker_pool": "aws_default"}, DAG) != []  # any other connection
    # a DAG author widens in code
    widened = DAG.widen(TriggerLimits(allowed_worker_pools=("kubernetes://batch/",)))
    assert refusals({**DEFAULTS, "worker_pool": "kubernetes://batch/llm"}, widened) == []
    assert refusals(attack, widened) != []


def test_kubernetes_settings_within_the_pinned_images_secrets_and_maxima() -> None:
    kube = {"image": "evil.example/miner:latest", "storage_secret": "prod-db", "model_pvc": "other",
            "gpus": 8, "namespace": "kube-system", "allowed_prefixes": ["/"]}  # fmt: skip
    reasons = refusals({**DEFAULTS, "kubernetes": kube}, DAG.widen(TriggerLimits(max_gpus=1)))
    text = "\n".join(reasons)
    for expected in (
        "kubernetes.allowed_prefixes is not a trigger setting",
        "kubernetes.namespace is not a trigger setting",
        "kubernetes.image 'evil.example/miner:latest'",
        "kubernetes.storage_secret 'prod-db'",
        "kubernetes.model_pvc 'other'",
        "kubernetes.gpus 8 is more than max_gpus 1",
    ):
        assert expected in text, text
    assert refusals({**DEFAULTS, "kubernetes": {"image": DEFAULT_IMAGE}}, DAG) == []
    tagged = TriggerLimits(allowed_images=("registry.example/batchinfer-worker:",))
    assert refusals({"kubernetes": {"image": "registry.example/batchinfer-worker:0.2"}}, tagged) == []
    assert refusals({"kubernetes": {"image": "registry.example/batchinfer-worker-evil:0.2"}}, tagged) != []


def test_service_account_and_pull_secrets_stay_within_the_dag_and_the_allowed_ones() -> None:
    """The pods' ServiceAccount is a cloud identity (IRSA, Workload Identity: what the workers may read
    and write in storage); a free choice would run them as any account of the namespace."""
    dag = implied_by({**DEFAULTS, "kubernetes": {"service_account": "batchinfer-s3-runs",
                                                 "image_pull_secrets": ["regcred"]}})  # fmt: skip
    assert dag.allowed_service_accounts == ("batchinfer-s3-runs",)
    assert dag.allowed_image_pull_secrets == ("regcred",)
    as_written = {"service_account": "batchinfer-s3-runs", "image_pull_secrets": ["regcred"]}
    assert refusals({**DEFAULTS, "kubernetes": as_written}, dag) == []  # the DAG's own, as written
    attack = {"service_account": "airflow-worker", "image_pull_secrets": ["regcred", "prod-registry"]}
    assert refusals({**DEFAULTS, "kubernetes": attack}, dag) == [
        "kubernetes.service_account 'airflow-worker' is not allowed (widen with the DAG's limits, the "
        "[batchinfer] allowed_service_accounts setting, or the pool connection's extra "
        "allowed_service_accounts)",
        "kubernetes.image_pull_secrets 'prod-registry' is not allowed (widen with the DAG's limits, the "
        "[batchinfer] allowed_image_pull_secrets setting, or the pool connection's extra "
        "allowed_image_pull_secrets)",
    ]
    # none by default: a DAG without them allows none
    assert len(refusals({"kubernetes": attack}, DAG)) == 3
    # the config section and the connection extra hold text; they widen, exactly (no prefixes)
    extra = {
        "allowed_service_accounts": "airflow-worker, eval-s3",
        "allowed_image_pull_secrets": ["prod-registry"],
    }
    widened = dag.widen(TriggerLimits.from_mapping(extra, "connection 'gpu'"))
    assert refusals({"kubernetes": attack}, widened) == []
    assert refusals({"kubernetes": {"service_account": "airflow-worker-2"}}, widened) != []
    judged = {"judge_pool": "j_conn", "judge_kubernetes": {"service_account": "admin"}}
    (why,) = refusals(judged, dag, judge_pool_is_connection=True)
    assert why.startswith("judge pool: kubernetes.service_account 'admin' is not allowed"), why


def test_kubernetes_env_names_stay_within_the_dag_and_the_allowed_ones() -> None:
    # env beats the storage Secret's envFrom: a free name would redirect the workers' storage
    attack = {"AWS_ENDPOINT_URL": "http://evil.example", "AWS_ACCESS_KEY_ID": "mine", "LD_PRELOAD": "/x.so"}
    reasons = refusals({**DEFAULTS, "kubernetes": {"env": attack}}, DAG)
    assert reasons == [
        f"kubernetes.env.{name} is not allowed (widen with the DAG's limits, the [batchinfer] allowed_env "
        "setting, or the pool connection's extra allowed_env)"
        for name in sorted(attack)
    ]
    dag = implied_by({**DEFAULTS, "kubernetes": {"env": {"HF_HOME": "/models/hf"}}})
    assert refusals({"kubernetes": {"env": {"HF_HOME": "/elsewhere"}}}, dag) == []  # the DAG's name
    widened = dag.widen(TriggerLimits.from_mapping({"allowed_env": "VLLM_LOGGING_LEVEL, NCCL_DEBUG"}, "conn"))
    assert (
        refusals({"kubernetes": {"env": {"VLLM_LOGGING_LEVEL": "DEBUG", "NCCL_DEBUG": "INFO"}}}, widened)
        == []
    )
    judged = {"judge_pool": "j_conn", "judge_kubernetes": {"env": {"LD_PRELOAD": "/x.so"}}}
    (why,) = refusals(judged, dag, judge_pool_is_connection=True)
    assert why.startswith("judge pool: kubernetes.env.LD_PRELOAD is not allowed"), why


def test_pod_placement_stays_on_the_dags_nodes_unless_allowed() -> None:
    gpu_nodes = {
        "node_selector": {"pool": "gpu"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
    }
    dag = implied_by({**DEFAULTS, "kubernetes": gpu_nodes})
    assert refusals({"kubernetes": gpu_nodes}, dag) == []
    reasons = refusals({"kubernetes": {"node_selector": {"pool": "system", "zone": "a"},
                                       "tolerations": [{"key": "node-role.kubernetes.io/control-plane"},
                                                       {"operator": "Exists"}]}}, dag)  # fmt: skip
    assert [r.split(" (widen")[0] for r in reasons] == [
        "kubernetes.node_selector pool=system is not allowed",
        "kubernetes.node_selector zone=a is not allowed",
        "kubernetes.tolerations may not tolerate every taint (a toleration without a key)",
        "kubernetes.tolerations may not tolerate the taint key 'node-role.kubernetes.io/control-plane'",
    ]
    assert "allowed_toleration_keys setting" in reasons[-1]
    wide = dag.widen(
        TriggerLimits(allowed_node_selectors=("zone", "pool=cpu"), allowed_toleration_keys=("*",))
    )
    assert refusals({"kubernetes": {"node_selector": {"zone": "b", "pool": "cpu"},
                                    "tolerations": [{"operator": "Exists"}]}}, wide) == []  # fmt: skip


def test_spot_nodes_need_their_taints_allowed() -> None:
    (why,) = refusals({"kubernetes": {"interruptible": True}}, DAG)
    assert why.startswith(
        "kubernetes.interruptible tolerates the spot taints ['batchinfer.io/interruptible'"
    ), why
    assert (
        refusals({"kubernetes": {"interruptible": True}}, implied_by({"kubernetes": {"interruptible": True}}))
        == []
    )


@pytest.mark.parametrize(
    ("kube", "problem"),
    [
        ({"node_selector": [["pool", "system"]]}, "kubernetes.node_selector must be an object of labels"),
        ({"env": ["LD_PRELOAD=/x.so"]}, "kubernetes.env must be an object of names to strings"),
        ({"tolerations": 5}, "kubernetes.tolerations must be a list of objects"),
        ({"tolerations": {"key": "x"}}, "kubernetes.tolerations must be a list of objects"),
        ({"tolerations": ["x"]}, "kubernetes.tolerations must be a list of objects"),
        ({"gpus": "lots"}, "kubernetes.gpus 'lots' is more than max_gpus 1"),
        ({"image_pull_secrets": "regcred"}, "kubernetes.image_pull_secrets must be a list of Secret names"),
        ({"image_pull_secrets": [{"name": "x"}]}, "kubernetes.image_pull_secrets must be a list"),
    ],
)
def test_malformed_kubernetes_settings_are_refused_not_skipped(kube: dict[str, Any], problem: str) -> None:
    reasons = refusals({"kubernetes": kube}, DAG.widen(TriggerLimits(max_gpus=1)))
    assert [r for r in reasons if r.startswith(problem)], reasons


def test_a_dag_default_that_is_malformed_is_an_error_when_the_dag_is_built() -> None:
    with pytest.raises(ConfigError, match=r"the DAG.s default kubernetes\.node_selector must be an object"):
        implied_by({"kubernetes": {"node_selector": "pool=gpu"}})
    with pytest.raises(ConfigError, match=r"the DAG.s default kubernetes\.image_pull_secrets must be a list"):
        implied_by({"kubernetes": {"image_pull_secrets": "regcred"}})


def test_judge_callables_and_replicas() -> None:
    judge = {"type": "all", "judges": [{"type": "length"}, {"type": "callable", "target": "os:system"}]}
    assert callable_targets(judge) == ["os:system"]
    (why,) = refusals({**DEFAULTS, "judge": judge}, DAG)
    assert "'os:system' is not allowed" in why
    jury = {"type": "jury", "judges": [{"type": "length"}, {**judge["judges"][1], "name": "sneaky"}]}
    assert callable_targets(jury) == ["os:system"]  # a jury's members are checked as well
    (why,) = refusals({**DEFAULTS, "judge": jury}, DAG)
    assert "'os:system' is not allowed" in why
    mine = TriggerLimits(allowed_judge_callables=("my_checks.",), max_replicas=4)
    assert refusals({"judge": {"type": "callable", "target": "my_checks.math:is_number"}}, mine) == []
    assert refusals({"replicas": 5}, mine) == ["replicas 5 is more than max_replicas 4"]


def test_limits_read_from_a_connection_or_config_text_and_widen() -> None:
    extra = {"backend": "kubernetes", "pool": "llm", "allowed_images": "reg/w:, reg/x:1",
             "max_replicas": "8", "allowed_input_prefixes": ["s3://data/"]}  # fmt: skip
    conn = TriggerLimits.from_mapping(extra, "connection 'gpu'")
    assert conn.allowed_images == ("reg/w:", "reg/x:1") and conn.max_replicas == 8
    both = conn.widen(TriggerLimits(max_replicas=16, allowed_images=("reg/w:",)))
    assert both.max_replicas == 16 and both.allowed_images == ("reg/w:", "reg/x:1")
    assert TriggerLimits().widen(conn).max_replicas == 8  # unset does not lift a pinned maximum
    with pytest.raises(ConfigError, match="max_gpus: expected a whole number"):
        TriggerLimits.from_mapping({"max_gpus": "lots"}, "[batchinfer]")
    assert matches("local://", "local://x") and not matches("local://a", "local://ab")


def test_the_factory_checks_at_the_first_tasks_with_its_defaults_and_limits() -> None:
    pytest.importorskip("airflow", reason="needs the airflow extra")
    from airflow_batchinfer.dag_factory import build_batch_inference_dag

    dag = build_batch_inference_dag(
        "limits_wiring",
        defaults={"input": "s3://data/a.jsonl", "output_root": "s3://runs/x"},
        limits=TriggerLimits(allowed_input_prefixes=("s3://data/more/",), max_replicas=3),
    )
    checked = {t.task_id: t.limits for t in dag.tasks if getattr(t, "limits", None) is not None}
    # the first tasks check the params; each round's plan checks what its gate's answer changes
    plans = {t.task_id for t in dag.tasks if t.task_id.endswith(".plan")}
    assert plans and set(checked) == {"shard", "pool_setup", "pool_teardown", *plans}
    assert all(checked[p] == checked["shard"] for p in plans)
    limits = checked["shard"]
    assert limits.allowed_input_prefixes == ("s3://data/a.jsonl", "s3://data/more/")
    assert limits.allowed_output_prefixes == ("s3://runs/x",) and limits.max_replicas == 3
    assert limits.allowed_worker_pools == ("local://batchinfer",)


def test_a_namespace_entry_does_not_let_a_trigger_choose_kubernetes_credentials() -> None:
    limits = TriggerLimits(allowed_worker_pools=("kubernetes://batch/",))
    assert refusals({"worker_pool": "kubernetes://batch/llm"}, limits) == []
    assert refusals({"worker_pool": "kubernetes://batch/llm?kubernetes_conn_id=prod_admin"}, limits) != []
    exact = TriggerLimits(allowed_worker_pools=("kubernetes://batch/llm?kubernetes_conn_id=k8s",))
    assert refusals({"worker_pool": "kubernetes://batch/llm?kubernetes_conn_id=k8s"}, exact) == []


def test_engine_model_and_engine_options_stay_within_the_dag() -> None:
    dag = implied_by(
        {**DEFAULTS, "engine": "vllm", "model": "/models/llama", "engine_options": {"max_model_len": 4096}}
    )
    assert (
        refusals({"engine": "vllm", "model": "/models/llama", "engine_options": {"max_model_len": 2048}}, dag)
        == []
    )
    attack = {"engine": "openai", "model": "/etc", "engine_options": {"base_url": "https://evil.example/v1",
                                                                      "trust_remote_code": True}}  # fmt: skip
    text = "\n".join(refusals(attack, dag))
    for expected in (
        "engine 'openai'",
        "model '/etc'",
        "engine_options.base_url",
        "engine_options.trust_remote_code",
    ):
        assert expected in text, text
    wider = dag.widen(
        TriggerLimits(allowed_models=("/models/",), allowed_engine_options=("trust_remote_code",))
    )
    assert refusals({"model": "/models/qwen", "engine_options": {"trust_remote_code": True}}, wider) == []


def test_a_run_name_is_one_folder() -> None:
    for bad in ("../../etc", "..", "a/b", "x`![p](evil.png)`"):
        assert refusals({**DEFAULTS, "run_name": bad}, DAG) != [], bad
    assert refusals({**DEFAULTS, "run_name": "eval-2026.11_30"}, DAG) == []


def test_a_judge_pool_is_held_to_the_same_limits_as_the_run_pool() -> None:
    """``judge_pool`` and its ``judge_*`` settings are a second pool: the DAG's defaults allow theirs
    as written, and a trigger cannot choose another pool, model, engine option or image for it."""
    judge = {"judge_pool": "local://judges", "judge_engine": "vllm", "judge_model": "/models/70b",
             "judge_engine_options": {"tensor_parallel_size": 4}, "judge_replicas": 2,
             "judge_kubernetes": {}}  # fmt: skip
    dag = implied_by({**DEFAULTS, **judge})
    assert refusals({**DEFAULTS, **judge}, dag) == []
    for change, word in (
        ({"judge_pool": "kubernetes://kube-system/x"}, "judge pool: worker_pool"),
        ({"judge_model": "/models/other"}, "judge pool: model '/models/other'"),
        (
            {"judge_engine_options": {"trust_remote_code": True}},
            "judge pool: engine_options.trust_remote_code",
        ),
        ({"judge_kubernetes": {"image": "evil/img"}}, "judge pool: kubernetes.image 'evil/img'"),
    ):
        (why,) = refusals({**DEFAULTS, **judge, **change}, dag)
        assert why.startswith(word), why
    # a batchinfer_pool connection pins its own pool, for the judge as for the run
    assert (
        refusals({**DEFAULTS, **judge, "judge_pool": "judge_conn"}, dag, judge_pool_is_connection=True) == []
    )
    assert refusals({**DEFAULTS, **judge, "judge_pool": "judge_conn"}, dag) != []
