"""Round 0's fan-out, its pure parts: the arms a setting gives, the rows and ids of a record, the
records it refuses, and how a range's description and a job's params carry it (none: as before)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.engines.adapters import Adapter, chosen, parse_adapters
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.params import parse_params
from airflow_batchinfer.storage.fan_out import FanOut
from airflow_batchinfer.storage.ranges import InputRange, range_params
from airflow_batchinfer.storage.reader import ErrorPolicy
from airflow_batchinfer.storage.shard_ref import RangeRef
from airflow_batchinfer.storage.validate import LineValidator

ADAPTERS = {"sql": "/m/sql", "poems": "/m/poems"}


def test_the_setting_gives_the_adapters_in_name_order_and_the_base_model_first() -> None:
    assert FanOut.of_mode("off", ADAPTERS) is None
    assert FanOut.of_mode("adapters", ADAPTERS) == FanOut(("poems", "sql"))
    both = FanOut.of_mode("adapters_and_base", ADAPTERS)
    assert both is not None and both.arms == ("base", "poems", "sql") and both.adapters == ("poems", "sql")


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        (
            {"fan_out": "adapters"},
            r"fan_out 'adapters' runs every record once per LoRA adapter, but the run ",
        ),
        (
            {"fan_out": "every", "adapters": ADAPTERS},
            r"fan_out 'every': choose one of off, adapters, adapters_",
        ),
        ({"adapters": {"base": "/m/base"}}, r"the adapter name 'base' means the base model"),
    ],
)
def test_the_run_refuses_a_fan_out_that_cannot_work(settings: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        RunConfig.of(input="x", run_root="y", prompt_template="{{ q }}", judge={"type": "llm"}, **settings)


def test_a_records_rows_carry_their_arm_and_its_id_and_ids_never_collide() -> None:
    fan = FanOut(("base", "sql"))
    record = {"id": "a@b", "q": "x"}  # an input id may hold "@": the arm is what follows the last one
    rows = fan.expand([record, {"id": 7, "q": "y"}], "id")
    assert rows == [
        {"id": "a@b@base", "q": "x", "input_id": "a@b", "adapter": "base"},
        {"id": "a@b@sql", "q": "x", "input_id": "a@b", "adapter": "sql"},
        {"id": "7@base", "q": "y", "input_id": 7, "adapter": "base"},
        {"id": "7@sql", "q": "y", "input_id": 7, "adapter": "sql"},
    ]
    assert record == {"id": "a@b", "q": "x"}  # the input's record is not changed
    assert fan.ids(["a@b", 7]) == [r["id"] for r in rows]
    # ids that end like a row id: still one row id each (adapter names hold no "@")
    many = fan.ids(["x", "x@sql", "x@base", "x@sql@base"])
    assert len(set(many)) == len(many) == 8
    # an OpenAI batch request keeps its body; its custom_id is the row's
    line = {"custom_id": "c1", "body": {"messages": [{"role": "user", "content": "hi"}], "model": "gpt"}}
    assert [r["custom_id"] for r in fan.expand([line], "custom_id")] == ["c1@base", "c1@sql"]


def test_a_rows_arm_picks_its_adapter_and_base_the_base_model() -> None:
    adapters = {"sql": Adapter("sql", "/m/sql")}
    base, sql = FanOut(("base", "sql")).expand([{"id": "a", "q": "x"}], "id")
    assert chosen(base, adapters) is None and chosen(sql, adapters) == adapters["sql"]


@pytest.mark.parametrize(
    ("record", "why"),
    [
        ({"id": "a", "adapter": "sql"}, "its adapter field 'sql' picks one adapter, but fan_out runs every "),
        ({"id": "a", "adapter": "base"}, "its adapter field 'base' picks one adapter"),
        ({"custom_id": "a", "body": {"model": "sql"}}, "its body's model 'sql' picks that adapter"),
        ({"id": "a", "input_id": 3}, "it has a field 'input_id', where fan_out writes the record's id"),
    ],
)
def test_a_record_that_picks_its_own_adapter_is_a_bad_line_naming_why(
    record: dict[str, Any], why: str
) -> None:
    fan = FanOut(("base", "sql"))
    assert why in str(fan.refusal(record))
    rejects: list[dict[str, Any]] = []
    policy = ErrorPolicy("data.jsonl", "quarantine", _Sink(rejects))
    check = LineValidator(policy, id_field=None, fan_out=fan)
    fine = {"custom_id": "b", "body": {"model": "gpt"}} if "custom_id" in record else {"id": "b", "q": 1}
    good, ids, _ = check.check_block([json.dumps(record).encode(), json.dumps(fine).encode()])
    assert ids == ["b"] and len(good) == 1 and policy.stats.quarantined == 1
    assert rejects[0]["line_no"] == 1 and why in rejects[0]["error"]
    # the base model's name, or a model no adapter has, in an OpenAI body: answered on every arm
    assert fan.refusal({"custom_id": "a", "body": {"model": "base"}}) is None
    assert fan.refusal({"custom_id": "a", "body": {"model": "gpt-4o"}}) is None


class _Sink:
    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def write(self, record: dict[str, Any]) -> None:
        self.rows.append(record)


def test_a_range_carries_its_arms_only_with_a_fan_out() -> None:
    shard = RangeRef(shard_id="part-00000", uri="/d.jsonl", records=9, range=(0, 90))
    plain = range_params(shard, id_field="id", assign_ids=False)["input_range"]
    assert "fan_out" not in plain  # a run without fan-out: its jobs' params (ids, fingerprints) as before
    assert InputRange.from_params(plain).fan_out is None
    arms = shard.model_copy(update={"fan_out": ("base", "sql")})
    fanned = range_params(arms, id_field="id", assign_ids=False)
    assert fanned["input_range"]["fan_out"] == ["base", "sql"]
    rng = InputRange.from_params(json.loads(json.dumps(fanned["input_range"])))  # as the job's JSON
    assert rng.fan_out == ("base", "sql") and rng.as_params() == fanned["input_range"]
    for bad in (["sql", "sql"], ["a@b"], [], "sql"):
        with pytest.raises(ConfigError, match=r"params\.input_range is not a range shard's description"):
            InputRange.from_params({**plain, "fan_out": bad})


def test_a_job_fanning_out_over_an_adapter_it_lacks_is_refused_at_submit() -> None:
    shard = RangeRef(shard_id="part-00000", uri="/d.jsonl", records=9, range=(0, 90), fan_out=("base", "sql"))
    params = {"prompt_template": "{{ q }}", "judge": {"type": "llm"}, "adapters": {"poems": "/m/poems"}}
    params.update(range_params(shard, id_field="id", assign_ids=False))
    with pytest.raises(ConfigError, match=r"fan_out names sql, which params.adapters does not \(poems\)"):
        parse_params("infer_judge", params)
    parse_params("infer_judge", {**params, "adapters": {"sql": "/m/sql"}})  # the base model needs none


def test_the_adapters_setting_keeps_the_base_models_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="give the adapter another name"):
        parse_adapters({"base": str(tmp_path)})
