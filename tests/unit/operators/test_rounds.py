"""The round controller's shard descriptors: each names its slot, whose plan holds the settings the
round runs (the mapped jobs read them there; templates stay out of XCom)."""

from __future__ import annotations

import pytest

pytest.importorskip("airflow", reason="needs the airflow extra")

from airflow_batchinfer.operators.rounds import GATE_PARAM, _descriptors, gate_params
from airflow_batchinfer.run.docs import Plan
from airflow_batchinfer.run.gate import GATE_SCHEMAS

SHARDS = [{"shard_id": f"part-0000{i}", "uri": f"/p/part-0000{i}.jsonl.zst", "records": 10} for i in range(2)]


@pytest.mark.parametrize("settings", [None, {"temperature": 1.3}])
def test_every_descriptor_names_its_slot_changed_or_not(settings: dict[str, float] | None) -> None:
    plan = Plan("round-01", 1, "rounds", list(SHARDS), settings=settings)  # type: ignore[arg-type]
    assert _descriptors(plan) == [{**s, "round": 1, "slot": "round-01"} for s in SHARDS]
    assert _descriptors(Plan("round-02", 2, "skip", list(SHARDS))) == []  # type: ignore[arg-type]


def test_the_gates_form_has_one_field_per_changeable_setting_with_its_schema() -> None:
    params = gate_params()
    assert set(params) == {GATE_PARAM.format(k) for k in GATE_SCHEMAS}
    for key, schema in GATE_SCHEMAS.items():
        param = params[GATE_PARAM.format(key)]
        assert param.value is None and {k: param.schema[k] for k in schema} == schema, key
