"""One description of the run settings (``airflow_batchinfer.spec.settings``): every DAG's trigger form can
be submitted as it opens, the params' schemas accept what the code accepts (``None`` for the
settings whose empty value means "the default") and refuse what it refuses, and the DAG params, the
``batchinfer run`` flags and ``RunConfig`` share one default per setting."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.cli import build_parser
from airflow_batchinfer.spec.limits import implied_by, refusals
from airflow_batchinfer.spec.settings import (
    BY_NAME,
    RUN_SETTINGS_SPEC,
    param_defaults,
    reference_table,
    run_settings_from_args,
    setting,
)
from airflow_batchinfer.state.config import RunConfig

DAGS = Path(__file__).parents[2] / "dags"
NULLABLE = {s.name for s in RUN_SETTINGS_SPEC if s.nullable}


def test_the_empty_means_default_settings_are_nullable() -> None:
    assert {"run_name", "model", "prompt_template", "system", "id_field", "budget_gpu_hours",
            "judge_model", "review_below_score", "max_tokens_cap", "retry_template",
            "retry_system"} == NULLABLE  # fmt: skip
    for s in RUN_SETTINGS_SPEC:
        schema = s.schema()
        if s.nullable:
            assert schema["type"] == [s.type, "null"], s.name
        elif s.type == "string":
            # the trigger form treats an empty required string as missing: refuse "" at build time
            assert schema.get("enum") or schema.get("minLength", 0) >= 1, s.name


def test_run_config_defaults_are_the_settings_defaults() -> None:
    """Every field of a RunConfig section is a run setting, its Setting made from the field (its
    default and description), and every run setting is a section's field; RunConfig is frozen."""
    fields = RunConfig.setting_fields()
    run_settings = {s.name for s in RUN_SETTINGS_SPEC if s.is_run_setting}
    assert set(fields) == run_settings
    for name, f in fields.items():
        if f.default is not dataclasses.MISSING:
            assert setting(name).default == f.default, name
        elif f.default_factory is not dataclasses.MISSING:
            assert setting(name).default == f.default_factory(), name
    cfg = RunConfig.of(run_root="/r", **{s.name: s.default for s in RUN_SETTINGS_SPEC if s.is_run_setting})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.retries.max_rounds = 5  # type: ignore[misc]
    assert cfg.replace(max_rounds=5).retries.max_rounds == 5


def test_the_lists_of_names_are_the_codes() -> None:
    from airflow_batchinfer.judges import JUDGE_TYPES
    from airflow_batchinfer.spec.limits import SAFE_NAME

    assert setting("judge").schema()["properties"]["type"]["enum"] == list(JUDGE_TYPES)
    assert SAFE_NAME.pattern in setting("run_name").pattern  # type: ignore[operator]


def test_only_judge_pool_has_a_param_default_of_its_own() -> None:
    """A DAG built with a judge pool always judges there; a run without one judges on its own pool."""
    differ = {s.name for s in RUN_SETTINGS_SPEC if s.param and s.dag_default != s.default}
    assert differ == {"judge_pool"}


# ------------------------------------------------------------------------------ the command line
def parse(*argv: str) -> Any:
    return build_parser().parse_args(["run", "data.jsonl", "/runs/r", *argv])


def test_cli_run_defaults_are_the_dag_defaults() -> None:
    args = parse()
    flagged = [s for s in RUN_SETTINGS_SPEC if s.flag and s.flag.startswith("--")]
    assert {s.name for s in flagged} >= {"strategy", "max_rounds", "max_attempts", "records_per_shard",
                                         "chunk_size", "id_field", "assign_ids", "prompt_template", "system",
                                         "sampling", "judge", "judge_pool"}  # fmt: skip
    for s in flagged:
        assert getattr(args, s.name) == s.default, s.name
        if s.param and s.name != "judge_pool":
            assert getattr(args, s.name) == s.dag_default, s.name
    # the pool flags that are DAG params too
    pool_flags = {"replicas": "replicas", "concurrency": "concurrency", "idle_ttl": "idle_ttl_s",
                  "target_batch_tokens": "target_batch_tokens"}  # fmt: skip
    for flag, name in pool_flags.items():
        assert getattr(args, flag) == setting(name).default, name
    # the shard and recompact tools cut shards of a run's size
    for command in (["shard", "a", "b"], ["recompact", "a", "b"]):
        assert build_parser().parse_args(command).records_per_shard == setting("records_per_shard").default
    # a run from the defaults is a RunConfig with its defaults
    cfg = RunConfig.of(run_root="/runs/r", **run_settings_from_args(args))
    assert cfg == RunConfig.of(
        input="data.jsonl", run_root="/runs/r", prompt_template=None, judge={"type": "llm"}
    )


def test_cli_run_flags_parse_and_check_values(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse("--records-per-shard", "50", "--sampling", '{"max_tokens": 8}', "--judge",
                 '{"type": "length", "min_chars": 1}', "--assign-ids", "--id-field", "",
                 "--hybrid-min-shrink", "0.5", "--max-failed-shards", "2", "--job-retries", "0")  # fmt: skip
    got = run_settings_from_args(args)
    assert got["records_per_shard"] == 50 and got["sampling"] == {"max_tokens": 8}
    assert got["judge"]["type"] == "length" and got["assign_ids"] is True and got["id_field"] is None
    assert (got["hybrid_min_shrink"], got["max_failed_shards"], got["job_retries"]) == (0.5, 2, 0)
    assert parse().sampling is not parse().sampling  # no shared mutable default
    for bad, why in ((["--records-per-shard", "0"], "0 is less than 1"),
                     (["--sampling", "[1]"], "is not a JSON object"),
                     (["--hybrid-min-shrink", "2"], "2.0 is more than 1"),
                     (["--strategy", "fastest"], "invalid choice")):  # fmt: skip
        with pytest.raises(SystemExit):
            parse(*bad)
        assert why in capsys.readouterr().err


# ----------------------------------------------------------------------------------- the DAGs
needs_airflow = pytest.mark.skipif(
    importlib.util.find_spec("airflow") is None, reason="needs the airflow extra"
)


def form_blockers(params: Any) -> list[str]:
    """The params Airflow 3.3's trigger form counts as missing (it disables Trigger): an empty value
    (None or "") of a type that does not allow null."""
    out = []
    for name in params:
        param = params.get_param(name)
        kind = param.schema.get("type")
        nullable = isinstance(kind, list) and "null" in kind
        if kind and not nullable and param.value in (None, ""):
            out.append(name)
    return out


def the_dags() -> dict[str, Any]:
    from airflow.dag_processing.dagbag import DagBag

    from airflow_batchinfer.dag_factory import build_batch_inference_dag

    bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {} and len(bag.dags) == 4
    return {
        **bag.dags,
        "factory": build_batch_inference_dag("factory"),
        "factory_judge_pool": build_batch_inference_dag("factory_judge_pool", judge_airflow_pool="judge"),
    }


@pytest.mark.airflow
@needs_airflow
def test_every_dag_triggers_from_the_form_as_it_opens() -> None:
    """The form submits every param's value; Airflow validates them against the schemas; the values
    are run settings the first task accepts and allowed by the DAG's own limits."""
    from airflow_batchinfer.dag_factory import JUDGE_POOL_DEFAULTS, RUN_SETTINGS

    for dag_id, dag in the_dags().items():
        params = copy.deepcopy(dag.params)
        assert form_blockers(params) == [], dag_id
        values = params.validate()  # what Airflow does with the submitted form
        assert set(values) == set(param_defaults()) | (set(JUDGE_POOL_DEFAULTS) if "judge_pool" in values
                                                          else set())  # fmt: skip
        run = {name: values[name] for name in RUN_SETTINGS if name in values}
        if "judge_pool" in values:
            run["judge_pool"] = values["judge_pool"]
        RunConfig.from_dict({**run, "run_root": "/tmp/r"}).validate()
        assert refusals(values, implied_by(values)) == [], dag_id


@pytest.mark.airflow
@needs_airflow
def test_empty_fields_of_the_nullable_params_are_accepted_and_mean_the_default() -> None:
    """The form sends an empty field as null: every nullable param takes it, and the code reads it
    as "the default" or "none"."""
    import jinja2

    from airflow_batchinfer.dag_factory import RUN_ROOT, RUN_SETTINGS

    for dag_id, dag in the_dags().items():
        params = copy.deepcopy(dag.params)
        nullable = [name for name in params if name in NULLABLE]
        assert {"run_name", "prompt_template", "system", "id_field", "budget_gpu_hours"} <= set(nullable)
        for name in nullable:
            params[name] = None  # validated on assignment
        values = params.validate()
        assert all(values[name] is None for name in nullable), dag_id
        run = {name: values[name] for name in RUN_SETTINGS}
        cfg = RunConfig.from_dict({**run, "run_root": "/tmp/r"}).validate()
        assert cfg.infer_params().wire()["id_field"] == "id" and cfg.budget.budget_gpu_hours is None
        assert refusals(values, implied_by(values)) == [], dag_id
    root = jinja2.Environment().from_string(RUN_ROOT)
    run_id = "manual__2026-01-01T00:00:00+00:00"
    assert root.render(params={"output_root": "/o/", "run_name": None}, run_id=run_id) == (
        "/o/manual__2026-01-01T00-00-00-00-00"
    )
    assert root.render(params={"output_root": "/o", "run_name": "eval-1"}, run_id=run_id) == "/o/eval-1"


@pytest.mark.airflow
@needs_airflow
@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("records_per_shard", 0),
        ("records_per_shard", "2000"),
        ("chunk_size", 0),
        ("max_rounds", 4),  # more than the DAG's round slots
        ("run_name", "../etc"),
        ("run_name", ".."),
        ("run_name", "a b"),
        ("run_name", "x" * 201),
        ("prompt_template", ""),
        ("id_field", ""),
        ("input", ""),
        ("worker_pool", ""),
        ("model", 7),
        ("judge", {}),
        ("judge", {"type": "oracle"}),
        ("strategy", "fastest"),
        ("review", None),
        ("hybrid_min_shrink", 1.5),
        ("budget_gpu_hours", -1),
        ("assign_ids", "yes"),
        ("sampling", None),
        ("sampling", {"max_tokens": 0}),
        ("sampling", {"top_p": 0}),
        ("sampling", {"temperature": -1}),
        ("sampling", {"x": 1}),  # a field no engine reads: refused, never dropped
        ("sampling", {"best_of": 2}),
        ("adapters", {"a b": "/m/lora"}),
        ("adapters", {"sql": "models/lora"}),
        ("adapters", {"sql": "s3://bucket/lora"}),
        ("adapters", {"sql": 1}),
        ("adapters", {"base": "/m/lora"}),  # the base model's name
        ("fan_out", "every"),
    ],
)
def test_the_schema_refuses_what_the_code_refuses(name: str, value: Any) -> None:
    from airflow.sdk.definitions.param import ParamValidationError

    from airflow_batchinfer.dag_factory import build_batch_inference_dag

    dag = build_batch_inference_dag("bad_values", max_rounds=3)
    params = copy.deepcopy(dag.params)
    with pytest.raises(ParamValidationError):
        params[name] = value


@pytest.mark.airflow
@needs_airflow
def test_the_schema_accepts_what_the_code_accepts() -> None:
    from airflow_batchinfer.dag_factory import RUN_SETTINGS, build_batch_inference_dag

    good = {
        "sampling": {"max_tokens": 64, "temperature": 0.7, "top_p": 1, "seed": 7, "stop": ["\n"], "n": 1},
        "judge": {"type": "all", "judges": [{"type": "length", "min_chars": 1},
                                            {"type": "regex", "pattern": "^\\d+$"}]},
        "run_name": "eval-2026.11_30", "prompt_template": "Q: {{ question }}", "id_field": "custom_id",
        "system": "", "model": "/models/m", "budget_gpu_hours": 2.5, "assign_ids": True, "max_rounds": 3,
        "hybrid_min_shrink": 0, "review_min_approval": 1, "preflight_records": 0, "max_failed_shards": 3,
        "adapters": {"sql": "/models/lora-sql", "poems.v2": "file:///models/lora-poems"},
        "fan_out": "adapters_and_base",
    }  # fmt: skip
    params = copy.deepcopy(build_batch_inference_dag("good_values", max_rounds=3).params)
    for name, value in good.items():
        params[name] = value
    values = params.validate()
    run = {name: values[name] for name in RUN_SETTINGS}
    RunConfig.from_dict({**run, "run_root": "/tmp/r"}).validate()
    params["sampling"] = {"stop": "END"}


@pytest.mark.airflow
@needs_airflow
def test_run_name_schema_matches_the_run_time_check() -> None:
    from airflow.sdk.definitions.param import ParamValidationError

    from airflow_batchinfer.dag_factory import build_batch_inference_dag

    params = build_batch_inference_dag("names").params
    for name in ("eval-2026.11_30", "a", ".hidden", "a..b", "x" * 200, ".", "..", "...", "a/b", "a b", "ü",
                 "x" * 201, "run\\1"):  # fmt: skip
        refused = refusals({"run_name": name}, implied_by({}))
        p = copy.deepcopy(params)
        try:
            p["run_name"] = name
            accepted = True
        except ParamValidationError:
            accepted = False
        assert accepted == (refused == []), name


@pytest.mark.airflow
@needs_airflow
def test_the_factory_refuses_unknown_defaults() -> None:
    from airflow_batchinfer.dag_factory import build_batch_inference_dag

    with pytest.raises(ValueError, match=r"unknown params \['record_per_shard'\]"):
        build_batch_inference_dag("typo", defaults={"record_per_shard": 10})
    with pytest.raises(ValueError, match="judge_pool: params of DAGs built with judge_airflow_pool"):
        build_batch_inference_dag("no_judge_pool", defaults={"judge_pool": "local://j"})


@pytest.mark.airflow
@needs_airflow
def test_params_carry_each_settings_description() -> None:
    from airflow_batchinfer.dag_factory import build_batch_inference_dag

    dag = build_batch_inference_dag("described", judge_airflow_pool="judge")
    for name in dag.params:
        assert dag.params.get_param(name).description == BY_NAME[name].help, name


def test_the_docs_table_has_a_row_per_setting() -> None:
    header, rows = reference_table()
    assert [r[0] for r in rows] == [f"``{s.name}``" for s in RUN_SETTINGS_SPEC]
    assert all(len(r) == len(header) for r in rows)
