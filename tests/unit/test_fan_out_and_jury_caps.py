"""Issue 37, item 2: fan-out arms and jury members multiply the work a trigger asks for, so they
count against the deployment's caps before any work: ``max_adapters`` (unset: 64), ``max_jury_members``
(unset: 9) and ``max_records_per_shard`` counted as rows after the fan-out (a record is a row per arm).

Before: ``fan_out`` over 5,000 adapters under ``max_records_per_shard`` 1,000 was admitted (each
shard job held 5,000 rows per 1,000 records), and so was a 200-member ``llm`` jury.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.spec.limit_settings import SETTINGS_BY_NAME, unset_cap
from airflow_batchinfer.spec.limits import TriggerLimits, cap_refusals, implied_by, refusals

pytestmark = pytest.mark.security

ADAPTERS = {f"a{i}": "/adapters/a" for i in range(5_000)}  # all under the one allowed directory


def _refused(params: dict[str, Any], limits: TriggerLimits) -> list[str]:
    limits = limits.widen(TriggerLimits(allowed_adapters=("/adapters/",)))
    return refusals(params, limits)


def _jury(members: int) -> dict[str, Any]:
    return {"type": "jury", "judges": [{"type": "llm", "max_tokens": 8}] * members}


def test_a_fan_out_counts_its_rows_against_max_records_per_shard() -> None:
    limits = TriggerLimits(max_records_per_shard=1_000, max_adapters=10_000)
    (why,) = _refused({"adapters": ADAPTERS, "fan_out": "adapters", "records_per_shard": 1_000}, limits)
    assert why.startswith("records_per_shard 1000 × 5000 fan_out arms, in rows, 5000000 is more than "
                          "max_records_per_shard 1000 (lower it, or widen with")  # fmt: skip
    assert "[batchinfer] max_records_per_shard" in why
    two = {"a": "/adapters/a", "b": "/adapters/b"}
    # the base model is an arm too; at the cap is allowed; fan_out off: a record is one row
    assert _refused({"adapters": two, "fan_out": "adapters_and_base", "records_per_shard": 334}, limits)
    assert _refused({"adapters": two, "fan_out": "adapters_and_base", "records_per_shard": 333}, limits) == []
    assert _refused({"adapters": two, "fan_out": "off", "records_per_shard": 1_000}, limits) == []


def test_adapters_are_capped_even_where_no_one_sets_the_cap() -> None:
    (why,) = _refused({"adapters": ADAPTERS}, TriggerLimits())
    assert why.startswith("adapters (LoRA adapters named) 5000 is more than max_adapters 64 (unset: its "
                          "default) (lower it, or widen with the DAG's limits")  # fmt: skip
    assert "[batchinfer] max_adapters" in why and "extra max_adapters" in why
    few = dict(list(ADAPTERS.items())[:64])
    assert _refused({"adapters": few, "fan_out": "adapters"}, TriggerLimits()) == []
    assert _refused({"adapters": ADAPTERS}, TriggerLimits(max_adapters=5_000)) == []
    assert _refused({"adapters": few}, TriggerLimits(max_adapters=8))  # a deployment may lower it


def test_jury_members_are_capped_counted_to_the_leaves() -> None:
    (why,) = cap_refusals({"judge": _jury(200)}, TriggerLimits())  # a DAG without limits= too
    assert why.startswith("judge (judges per answer) 200 is more than max_jury_members 9 (unset: its")
    assert "[batchinfer] max_jury_members" in why
    assert cap_refusals({"judge": _jury(9)}, TriggerLimits()) == []
    nested = {"type": "all", "judges": [_jury(5), {"type": "any", "judges": [_jury(5)]}]}  # 10 leaves
    assert cap_refusals({"judge": nested}, TriggerLimits())
    assert cap_refusals({"judge": nested}, TriggerLimits(max_jury_members=10)) == []
    assert cap_refusals({"judge": {"type": "regex", "pattern": "x"}}, TriggerLimits(max_jury_members=1)) == []


def test_a_dags_default_above_the_unset_cap_is_allowed_as_written() -> None:
    implied = implied_by({"adapters": ADAPTERS, "judge": _jury(12)})
    assert (implied.max_adapters, implied.max_jury_members) == (5_000, 12)
    assert implied_by({"judge": _jury(3)}).max_jury_members is None  # at or below: the default holds


def test_the_caps_and_their_defaults_are_described_where_deployments_read_them() -> None:
    from airflow_batchinfer.get_provider_info import get_provider_info

    options = get_provider_info()["config"]["batchinfer"]["options"]
    for cap, default in (("max_adapters", 64), ("max_jury_members", 9)):
        assert unset_cap(cap) == default and f"unset: {default}" in SETTINGS_BY_NAME[cap].help
        assert cap in options
    security = (Path(__file__).parents[2] / "docs" / "security.md").read_text()
    assert "`max_adapters`" in security and "`max_jury_members`" in security
