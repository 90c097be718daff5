"""Issue 22, item 7: the size of the work a trigger puts on a shared pool is capped by the deployment.

Every setting that sizes work (chunk, shard, attempts, batch and completion tokens, concurrency,
pre-flight records, idle time, and a worker pod's cpu, memory and shared memory) has a cap among the
limits (``max_*``), pinned by the DAG's ``limits=``, the ``[batchinfer]`` config section or the pool
connection's extra. :func:`refusals` refuses a value over its cap, naming the setting, the value,
the cap and where to widen it; at or below the cap is allowed, and an unset cap is no cap.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.pools.kubernetes.spec import KubernetesPoolSpec, parse_quantity
from airflow_batchinfer.spec.limit_settings import SETTINGS, unset_cap
from airflow_batchinfer.spec.limits import TriggerLimits, cap_refusals, implied_by, refusals
from airflow_batchinfer.spec.pool_limits import RESOURCE_CAPS, SIZE_CAPS, WORK_COUNTS
from tests.support.airflow_ti import FakeTI

pytestmark = pytest.mark.security

KUBE_POOL = "kubernetes://batch/gpu"
# the value a test uses under each count cap: (cap, at the cap, over it)
COUNTS = {name: (cap, 10, 11) for name, cap in SIZE_CAPS}


def _refused(params: dict[str, Any], limits: TriggerLimits) -> list[str]:
    """The refusals that concern the caps (the pool and the paths are not under test here)."""
    limits = limits.widen(TriggerLimits(allowed_worker_pools=("local://", "kubernetes://batch/")))
    return refusals(params, limits)


def test_every_cap_among_the_limits_is_checked() -> None:
    caps = {s.name for s in SETTINGS if s.type in ("count", "quantity")}
    checked = {cap for _, cap in SIZE_CAPS} | {cap for _, cap in RESOURCE_CAPS}
    assert caps - checked - set(WORK_COUNTS) == {"max_replicas", "max_gpus", "max_max_tokens"}  # on their own
    assert {s.name for s in SETTINGS if s.type == "quantity"} == {"max_cpu", "max_memory", "max_shm_size"}


@pytest.mark.parametrize(("param", "cap"), SIZE_CAPS)
def test_a_sizing_param_over_its_cap_is_refused_at_or_below_allowed(param: str, cap: str) -> None:
    limits = TriggerLimits(**{cap: 10})
    (why,) = _refused({param: 11}, limits)
    assert why.startswith(f"{param} 11 is more than {cap} 10")
    assert f"[batchinfer] {cap}" in why and f"extra {cap}" in why and "DAG's limits" in why
    assert _refused({param: 10}, limits) == []
    assert _refused({param: 1}, limits) == []
    # unset: no cap, but for the input bounds, capped at their default (tested below)
    assert _refused({param: 10_000}, TriggerLimits()) == [] or unset_cap(cap) == 512


def test_a_value_that_is_no_number_is_over_the_cap() -> None:
    assert _refused({"chunk_size": "lots"}, TriggerLimits(max_chunk_size=10))
    assert _refused({"idle_ttl_s": None}, TriggerLimits(max_idle_ttl_s=3600))  # None: never idles out


def test_judge_concurrency_is_capped_for_the_judge_pool() -> None:
    params = {"worker_pool": "local://run", "judge_pool": "local://judge", "judge_concurrency": 64}
    (why,) = _refused(params, TriggerLimits(max_concurrency=8))
    assert why.startswith("judge pool: concurrency 64 is more than max_concurrency 8")


def test_completion_tokens_of_the_run_and_of_an_llm_judge_are_capped() -> None:
    limits = TriggerLimits(max_max_tokens=512)
    assert _refused({"sampling": {"max_tokens": 512}}, limits) == []
    (why,) = _refused({"sampling": {"max_tokens": 100_000}}, limits)
    assert why.startswith("sampling.max_tokens 100000 is more than max_max_tokens 512")
    # max_completion_tokens wins over max_tokens, as the engines read it
    assert _refused({"sampling": {"max_tokens": 8, "max_completion_tokens": 4096}}, limits)
    # unset: the engines' default of 256 tokens, checked against a lower cap
    assert _refused({"sampling": {}}, TriggerLimits(max_max_tokens=128))
    assert _refused({"sampling": {}}, limits) == []
    judge = {"type": "all", "judges": [{"type": "regex", "pattern": "x"},
                                       {"type": "llm", "sampling": {"max_tokens": 9000}}]}  # fmt: skip
    (why,) = _refused({"judge": judge}, limits)
    assert why.startswith("judge max_tokens 9000 is more than max_max_tokens 512")
    assert _refused({"judge": {"type": "llm", "max_tokens": 64}}, limits) == []
    jury = {"type": "jury", "judges": [{"type": "classifier"}, {"type": "llm", "max_tokens": 9000}]}
    (why,) = _refused({"judge": jury}, limits)  # a jury member's budget is capped as well
    assert why.startswith("judge max_tokens 9000 is more than max_max_tokens 512")


@pytest.mark.parametrize(
    ("key", "cap", "at", "over"),
    [("cpu", "max_cpu", "8", "8500m"), ("memory", "max_memory", "64Gi", "65537Mi"),
     ("shm_size", "max_shm_size", "16Gi", "18G")],  # 16Gi is 17.18 G
)  # fmt: skip
def test_pod_resources_over_their_cap_are_refused(key: str, cap: str, at: str, over: str) -> None:
    limits = TriggerLimits(**{cap: at})
    params = {"worker_pool": KUBE_POOL, "kubernetes": {"gpus": 1, "cpu": "1", "memory": "1Gi",
                                                       "shm_size": "1Gi"}}  # fmt: skip
    assert _refused({**params, "kubernetes": {**params["kubernetes"], key: at}}, limits) == []
    (why,) = _refused({**params, "kubernetes": {**params["kubernetes"], key: over}}, limits)
    assert why.startswith(f"kubernetes.{key} {over!r} is more than {cap} {at}")
    assert f"[batchinfer] {cap}" in why
    assert _refused({**params, "kubernetes": {**params["kubernetes"], key: "a lot"}}, limits)


def test_a_kubernetes_run_that_leaves_a_resource_out_gets_the_pools_default_checked() -> None:
    limits = TriggerLimits(max_memory="16Gi", max_cpu="2", max_shm_size="1Gi")
    (cpu, mem, shm) = _refused({"worker_pool": KUBE_POOL, "kubernetes": {}}, limits)
    assert mem.startswith("kubernetes.memory (unset: the pool's default) '32Gi' is more than max_memory 16Gi")
    assert cpu.startswith("kubernetes.cpu (unset: the pool's default) '4'")
    assert "kubernetes.shm_size" in shm
    # a CPU worker mounts no shared memory; a local pool takes no Kubernetes settings
    cpu_only = {"gpus": 0, "cpu": "2", "memory": "8Gi"}
    assert _refused({"worker_pool": KUBE_POOL, "kubernetes": cpu_only}, limits) == []
    assert _refused({"worker_pool": "local://batchinfer", "kubernetes": {}}, limits) == []


def test_quantities_parse_as_kubernetes_does() -> None:
    kubernetes = pytest.importorskip("kubernetes", reason="compared with the kubernetes client's parser")
    for text in ("4", "500m", "0.5", "1.5", "32Gi", "1024Mi", "8G", "1e3", "2E", "3Ei", "100k", "10u", ".5"):
        assert parse_quantity(text, "q") == Decimal(kubernetes.utils.parse_quantity(text)), text
    assert parse_quantity(4, "q") == 4
    for bad in ("", "lots", "-1", "1GB", "1 Gi", "Gi", True, None, [1]):
        with pytest.raises(ConfigError, match=r"q: .* is not a Kubernetes quantity"):
            parse_quantity(bad, "q")


@pytest.mark.parametrize("text", ["٤Gi", "１Gi", "1e٣", "৮", "4.５"])
def test_a_quantity_of_other_scripts_digits_is_refused_as_kubernetes_refuses_it(text: str) -> None:
    """Before: ``\\d`` took any Unicode digit (``Decimal`` reads "٤" as 4): a cap or a request the
    API server would refuse passed here."""
    with pytest.raises(ConfigError, match="is not a Kubernetes quantity"):
        parse_quantity(text, "q")
    assert _refused({"worker_pool": KUBE_POOL, "kubernetes": {"cpu": text}}, TriggerLimits(max_cpu="64"))


def test_quantity_caps_compare_by_amount_and_bad_ones_are_refused_where_they_are_set() -> None:
    assert TriggerLimits(max_memory="16Gi").widen(TriggerLimits(max_memory="20000Mi")).max_memory == "20000Mi"
    assert TriggerLimits(max_memory="64Gi").widen(TriggerLimits(max_memory="1Ti")).max_memory == "1Ti"
    assert TriggerLimits(max_cpu="8").widen(TriggerLimits(max_cpu="500m")).max_cpu == "8"
    assert TriggerLimits(max_memory="64Gi").widen(TriggerLimits()).max_memory == "64Gi"
    with pytest.raises(ConfigError, match="connection 'gpu': max_memory: '64 gigs' is not a Kubernetes"):
        TriggerLimits.from_mapping({"max_memory": "64 gigs"}, "connection 'gpu'")
    with pytest.raises(ConfigError, match="max_cpu"):
        TriggerLimits(max_cpu="many")
    assert TriggerLimits.from_mapping({"max_memory": " ", "max_chunk_size": ""}, "x") == TriggerLimits()


def test_the_pool_spec_refuses_a_resource_that_is_no_quantity() -> None:
    with pytest.raises(ConfigError, match="memory: '32 GB' is not a Kubernetes quantity"):
        KubernetesPoolSpec(allowed_prefixes=("s3://b/",), memory="32 GB")


# ------------------------------------------------------------ the three sources, where a task gathers them
@pytest.fixture
def gather(monkeypatch: pytest.MonkeyPatch) -> Any:
    pytest.importorskip("airflow", reason="needs the airflow extra")
    from airflow_batchinfer.operators import limits as gather

    connections = {"gpu_pool": SimpleNamespace(conn_type="batchinfer_pool", extra_dejson={
        "backend": "kubernetes", "pool": "gpu", "namespace": "batch", "max_memory": "64Gi",
        "max_chunk_size": 1000})}  # fmt: skip
    monkeypatch.setattr(gather.BaseHook, "get_connection", staticmethod(lambda conn_id: connections[conn_id]))
    return gather


def _check(gather: Any, dag: TriggerLimits, **params: Any) -> TriggerLimits:
    base = TriggerLimits(
        allowed_output_prefixes=("/data/runs",), allowed_worker_pools=("local://batchinfer",)
    )
    limits: TriggerLimits = gather.check_params(
        {"params": {"output_root": "/data/runs", **params}}, dag.widen(base)
    )
    return limits


def test_caps_come_from_the_dags_limits(gather: Any) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    with pytest.raises(
        AirflowFailException, match="records_per_shard 5000 is more than max_records_per_shard 1000"
    ):
        _check(gather, TriggerLimits(max_records_per_shard=1000), records_per_shard=5000)
    _check(gather, TriggerLimits(max_records_per_shard=1000), records_per_shard=1000)


def test_caps_come_from_the_config_section(gather: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    monkeypatch.setenv("AIRFLOW__BATCHINFER__MAX_TARGET_BATCH_TOKENS", "32768")
    monkeypatch.setenv("AIRFLOW__BATCHINFER__MAX_SHM_SIZE", "16Gi")
    with pytest.raises(AirflowFailException) as err:
        _check(gather, TriggerLimits(), worker_pool="local://batchinfer", target_batch_tokens=10**6,
               kubernetes={"gpus": 1, "shm_size": "64Gi"})  # fmt: skip
    assert "target_batch_tokens 1000000 is more than max_target_batch_tokens 32768" in str(err.value)
    assert "kubernetes.shm_size '64Gi' is more than max_shm_size 16Gi" in str(err.value)
    assert "Nothing was started or written" in str(err.value)
    in_force = _check(gather, TriggerLimits(), worker_pool="local://batchinfer", target_batch_tokens=32768)
    assert in_force.max_shm_size == "16Gi"


def test_caps_come_from_the_pool_connections_extra(gather: Any) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    with pytest.raises(
        AirflowFailException, match=r"kubernetes\.memory '128Gi' is more than max_memory 64Gi"
    ):
        _check(gather, TriggerLimits(), worker_pool="gpu_pool", kubernetes={"memory": "128Gi"})
    with pytest.raises(AirflowFailException, match="chunk_size 5000 is more than max_chunk_size 1000"):
        _check(gather, TriggerLimits(), worker_pool="gpu_pool", chunk_size=5000)
    in_force = _check(gather, TriggerLimits(), worker_pool="gpu_pool", chunk_size=1000,
                      kubernetes={"memory": "64Gi", "cpu": "4", "shm_size": "8Gi"})  # fmt: skip
    assert (in_force.max_memory, in_force.max_chunk_size) == ("64Gi", 1000)


# ------------------------------------------------ a review gate's answer is held to the same caps
def _gated_run(tmp_path: Any, **sampling: Any) -> tuple[Any, Any]:
    """A run whose round 0 left 5 rows pending, and the proposal of its round-01 gate."""
    from airflow_batchinfer.run.close import close_round
    from airflow_batchinfer.run.plan import propose_slot
    from tests.support.fake_jobs import IDS, finish_shard, make_run, plan_round

    cfg = make_run(tmp_path, review="every_round", max_rounds=3, judge={"type": "length", "min_chars": 1},
                   sampling={"temperature": 0.7, **sampling})  # fmt: skip
    plan = plan_round(cfg)
    for shard in plan.shards:
        finish_shard(cfg, 0, shard, set(IDS[:25]))
    assert close_round(cfg, plan) is not None
    return cfg, propose_slot(cfg, "round-01")


def test_a_gate_answer_over_a_cap_is_refused_before_it_takes_effect(tmp_path: Any) -> None:
    from airflow_batchinfer.exceptions import ReviewError
    from airflow_batchinfer.run.plan import CONTINUE, apply_choice
    from airflow_batchinfer.state.docs import read_plan
    from airflow_batchinfer.state.layout import RunLayout

    cfg, proposal = _gated_run(tmp_path, max_tokens=8)
    limits = TriggerLimits(max_max_tokens=512)
    with pytest.raises(ReviewError, match=r"round-01: the answer of review \(alice\) is refused.*"
                       r"sampling\.max_tokens 100000 is more than max_max_tokens 512") as err:  # fmt: skip
        apply_choice(
            cfg, proposal, CONTINUE, by="review (alice)", changes={"max_tokens": 100_000}, limits=limits
        )
    assert "[batchinfer] max_max_tokens" in str(err.value) and "Remedy" in str(err.value)
    assert read_plan(RunLayout(cfg.run_root), "round-01") is None  # nothing of it was applied
    # at the cap, and a change that touches no cap, take effect as before
    within = {"max_tokens": 512, "system": "Be brief."}
    assert apply_choice(cfg, proposal, CONTINUE, changes=within, limits=limits).settings == within
    # no limits given (a plan task built without them): no caps, as before
    over = {"max_tokens": 100_000}
    assert apply_choice(cfg, proposal, CONTINUE, changes=over).settings == over


def test_a_gate_answer_is_checked_as_the_engines_read_the_sampling(tmp_path: Any) -> None:
    from airflow_batchinfer.exceptions import ReviewError
    from airflow_batchinfer.run.plan import CONTINUE, apply_choice

    # max_completion_tokens wins over max_tokens: a larger max_tokens changes nothing the engine spends
    cfg, proposal = _gated_run(tmp_path, max_completion_tokens=64)
    limits = TriggerLimits(max_max_tokens=512)
    assert apply_choice(cfg, proposal, CONTINUE, changes={"max_tokens": 4096}, limits=limits).settings
    # unset in the run: a temperature change leaves the engines' 256, checked against a lower cap
    (tmp_path / "plain").mkdir()
    plain, gate = _gated_run(tmp_path / "plain")
    low = TriggerLimits(max_max_tokens=128)
    with pytest.raises(ReviewError, match=r"sampling\.max_tokens 256 is more than max_max_tokens 128"):
        apply_choice(plain, gate, CONTINUE, changes={"temperature": 1.2}, limits=low)


def _refuses_an_answer_over_512(op: Any, run_root: str) -> dict[str, Any]:
    """A plan task refuses a gate answer over ``max_max_tokens`` 512 and writes no plan; the answer."""
    from airflow_batchinfer.exceptions import ReviewError
    from airflow_batchinfer.run.plan import CONTINUE
    from airflow_batchinfer.state.docs import read_plan
    from airflow_batchinfer.state.layout import RunLayout

    answer = {"chosen_options": [CONTINUE], "responded_by_user": {"name": "alice"},
              "params_input": {"next_max_tokens": 100_000}}  # fmt: skip
    with pytest.raises(ReviewError, match="max_tokens 100000 is more than max_max_tokens 512"):
        op.execute_complete({"params": {}}, answer)
    assert read_plan(RunLayout(run_root), "round-01") is None
    return answer


def test_the_plan_task_refuses_an_answer_over_the_caps_in_force(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("airflow", reason="needs the airflow extra")
    from airflow.providers.standard.operators.hitl import HITLOperator

    from airflow_batchinfer.dag_factory import build_batch_inference_dag
    from airflow_batchinfer.operators import rounds as round_ops

    cfg, _ = _gated_run(tmp_path, max_tokens=8)
    monkeypatch.setattr(round_ops, "owned_run_config", lambda run_root, context, so=None: cfg)
    monkeypatch.setattr(HITLOperator, "execute_complete", lambda self, context, event: event)
    monkeypatch.setenv("AIRFLOW__BATCHINFER__MAX_MAX_TOKENS", "512")  # the deployment's cap
    # the factory's plan tasks get the DAG's limits (here none of their own: the config's cap holds)
    (plan_task,) = [t for t in build_batch_inference_dag("caps", max_rounds=2).tasks
                    if t.task_id == "round_01.plan"]  # fmt: skip
    assert isinstance(plan_task, round_ops.RoundControllerOperator) and plan_task.limits is not None
    op = round_ops.RoundControllerOperator(task_id="plan", slot="round-01", run_root=cfg.run_root,
                                           limits=plan_task.limits)  # fmt: skip
    _refuses_an_answer_over_512(op, cfg.run_root)


# ---------------------------------------- issue 22 round two, B2: the input bounds are capped too
LINE, ID = 16 * 1024 * 1024, 512  # the settings' defaults, also the caps while none is set


def test_a_trigger_may_lower_the_input_bounds_but_not_raise_them() -> None:
    """Before: ``max_line_bytes``/``max_id_bytes`` had no cap, so a trigger could make every reader
    hold a 1 TiB line whole (item 5 reopened)."""
    limits = TriggerLimits(max_chunk_size=100)
    line, ident = refusals({"max_line_bytes": 2**40, "max_id_bytes": 2**30}, limits)
    assert line.startswith(f"max_line_bytes {2**40} is more than max_max_line_bytes {LINE} (unset: the "
                           "max_line_bytes setting's default)")  # fmt: skip
    assert ident.startswith(f"max_id_bytes {2**30} is more than max_max_id_bytes {ID} (unset:")
    assert "[batchinfer] max_max_line_bytes" in line and "extra max_max_id_bytes" in ident
    assert refusals({"max_line_bytes": LINE, "max_id_bytes": ID}, limits) == []  # the defaults
    assert refusals({"max_line_bytes": 1024, "max_id_bytes": 32}, limits) == []  # lowered
    assert (unset_cap("max_max_line_bytes"), unset_cap("max_max_id_bytes")) == (LINE, ID)
    assert unset_cap("max_chunk_size") is None  # the other caps: unset is no cap


def test_the_deployment_sets_the_input_bound_caps_either_way() -> None:
    raised = TriggerLimits(max_max_line_bytes=2**26).widen(TriggerLimits.from_mapping(
        {"max_max_id_bytes": "4096"}, "[batchinfer]"))  # fmt: skip
    assert refusals({"max_line_bytes": 2**26, "max_id_bytes": 4096}, raised) == []
    (over,) = refusals({"max_line_bytes": 2**26 + 1}, raised)
    assert over.startswith(f"max_line_bytes {2**26 + 1} is more than max_max_line_bytes {2**26} (lower")
    lowered = TriggerLimits(max_max_line_bytes=2**20)  # a cap below the default holds for the default
    assert refusals({"max_line_bytes": LINE}, lowered)
    assert cap_refusals({"max_id_bytes": 10**6, "input": "/anywhere"}, TriggerLimits()) != []


def test_a_dags_default_above_the_bound_is_allowed_as_written() -> None:
    """The DAG's author wrote it (``implied_by``); a default at the bound sets no cap, so the
    deployment may still lower it."""
    implied = implied_by({"max_line_bytes": 2**26, "max_id_bytes": ID})
    assert (implied.max_max_line_bytes, implied.max_max_id_bytes) == (2**26, None)
    assert refusals({"max_line_bytes": 2**26}, implied) == []
    assert implied_by({"max_line_bytes": LINE}).max_max_line_bytes is None


def test_the_input_bound_caps_are_described_where_deployments_read_them() -> None:

    from airflow_batchinfer.get_provider_info import get_provider_info
    from airflow_batchinfer.spec.settings import setting

    helps = {s.name: s.help for s in SETTINGS}
    for cap, of in (("max_max_line_bytes", "max_line_bytes"), ("max_max_id_bytes", "max_id_bytes")):
        assert f"`{of}`" in helps[cap] and "unset: that setting's default" in helps[cap]
        assert cap in setting(of).help
        assert cap in get_provider_info()["config"]["batchinfer"]["options"]
    caps_doc = (Path(__file__).parents[2] / "docs" / "security.md").read_text()
    assert "`max_max_line_bytes`" in caps_doc and "`max_max_id_bytes`" in caps_doc


def test_a_shard_task_without_limits_holds_the_params_to_the_deployments_caps(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: a task built without ``limits=`` checked nothing, so a hand-built DAG's triggers were
    never held to ``[batchinfer] max_*``."""
    pytest.importorskip("airflow", reason="needs the airflow extra")
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_batchinfer.operators.shard import ShardDatasetOperator

    data = tmp_path / "data.jsonl"
    data.write_text("".join(f'{{"id": {i}, "q": "x"}}\n' for i in range(4)))
    run_root = tmp_path / "runs" / "r"
    config = {"input": str(data), "run_root": str(run_root), "prompt_template": "{{ q }}",
              "judge": {"type": "llm"}, "chunk_size": 5000}  # fmt: skip
    monkeypatch.setenv("AIRFLOW__BATCHINFER__MAX_CHUNK_SIZE", "100")
    op = ShardDatasetOperator(task_id="shard", config=config)
    assert op.limits is None
    with pytest.raises(AirflowFailException) as err:
        op.execute({"params": {"chunk_size": 5000, "max_line_bytes": 2**30}, "ti": FakeTI()})  # type: ignore[arg-type]
    assert "chunk_size 5000 is more than max_chunk_size 100" in str(err.value)
    assert "max_line_bytes 1073741824 is more than max_max_line_bytes" in str(err.value)
    assert not run_root.exists()  # refused before anything was written
    # the paths, pools and engines stay the DAG's code's to vouch for: only the caps are checked
    config["chunk_size"] = 100
    op = ShardDatasetOperator(task_id="shard", config=config)
    params = {"chunk_size": 100, "input": str(data), "worker_pool": "local://anything"}
    assert op.execute({"params": params, "ti": FakeTI()})  # type: ignore[arg-type]


def test_pool_tasks_without_limits_hold_the_params_to_the_deployments_caps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before: pool_setup and pool_teardown built without ``limits=`` checked nothing."""
    pytest.importorskip("airflow", reason="needs the airflow extra")
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_batchinfer.operators.pool import PoolSetupOperator, PoolTeardownOperator

    monkeypatch.setenv("AIRFLOW__BATCHINFER__MAX_REPLICAS", "2")
    context = {"params": {"replicas": 8}, "ti": FakeTI()}
    for op in (PoolSetupOperator(task_id="pool_setup", worker_pool="local://capped", replicas=8),
               PoolTeardownOperator(task_id="pool_teardown", worker_pool="local://capped")):  # fmt: skip
        assert op.limits is None
        with pytest.raises(AirflowFailException, match="replicas 8 is more than max_replicas 2"):
            op.execute(context)  # type: ignore[arg-type]


def test_a_plan_task_without_limits_refuses_an_answer_over_the_deployments_cap(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: ``limits=None`` skipped the check, so a gate answer was never held to the caps."""
    pytest.importorskip("airflow", reason="needs the airflow extra")
    from airflow.providers.standard.operators.hitl import HITLOperator

    from airflow_batchinfer.operators import rounds as round_ops

    cfg, _ = _gated_run(tmp_path, max_tokens=8)
    monkeypatch.setattr(round_ops, "owned_run_config", lambda run_root, context, so=None: cfg)
    monkeypatch.setattr(HITLOperator, "execute_complete", lambda self, context, event: event)
    monkeypatch.setenv("AIRFLOW__BATCHINFER__MAX_MAX_TOKENS", "512")
    op = round_ops.RoundControllerOperator(task_id="plan", slot="round-01", run_root=cfg.run_root, slots=1)
    assert op.limits is None
    answer = _refuses_an_answer_over_512(op, cfg.run_root)
    within = {**answer, "params_input": {"next_max_tokens": 512}}
    assert op.execute_complete({"params": {}}, within) is not None  # type: ignore[arg-type]
