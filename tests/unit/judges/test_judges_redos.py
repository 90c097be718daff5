"""Regex judges cannot stall a worker: ``regex`` and ``json_schema`` patterns run on RE2 (linear time,
no backtracking), a pattern RE2 cannot run is a ConfigError at build time, and rule judges check
their records off the event loop."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

import pytest

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges import JudgeItem, Verdict
from airflow_batchinfer.judges.rules import RuleJudge
from airflow_batchinfer.state.params import parse_params

pytestmark = pytest.mark.security

EVIL = "(a+)+$"
ATTACK = "a" * 32 + "!"  # 2**32 paths for a backtracking engine


def judge_of(spec: dict[str, Any]) -> Any:
    judge = parse_params("judge", {"judge": spec}).judge
    assert judge is not None
    return judge


async def verdicts(spec: dict[str, Any], results: Sequence[str]) -> list[Verdict]:
    judge = judge_of(spec)
    return list(await judge.judge([JudgeItem({}, r, str(i)) for i, r in enumerate(results)]))


@pytest.mark.timeout(20)
async def test_catastrophic_regex_is_linear() -> None:
    started = time.monotonic()
    out = await verdicts({"type": "regex", "pattern": EVIL, "must_match": True}, [ATTACK] * 200 + ["aaa"])
    assert time.monotonic() - started < 5
    assert [v.approved for v in out] == [False] * 200 + [True]
    assert out[0].reason == "pattern not found"


@pytest.mark.parametrize(
    ("pattern", "hint"),
    [(r"(a)\1", "backreference"), (r"foo(?=bar)", "lookaround"), (r"(?<!x)y", "lookaround")],
)
def test_a_pattern_re2_cannot_run_is_a_config_error_with_a_rewrite(pattern: str, hint: str) -> None:
    with pytest.raises(ConfigError, match="RE2") as info:
        judge_of({"type": "regex", "pattern": pattern})
    assert hint in str(info.value) and pattern in str(info.value)


def test_an_invalid_pattern_is_still_a_config_error() -> None:
    with pytest.raises(ConfigError, match="invalid pattern"):
        judge_of({"type": "regex", "pattern": "["})


@pytest.mark.timeout(20)
async def test_json_schema_pattern_runs_on_re2() -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string", "pattern": EVIL}}}
    started = time.monotonic()
    out = await verdicts(
        {"type": "json_schema", "schema": schema}, [json.dumps({"name": ATTACK})] * 50 + ['{"name": "aa"}']
    )
    assert time.monotonic() - started < 5
    assert [v.approved for v in out] == [False] * 50 + [True]
    assert "does not match" in out[0].reason


@pytest.mark.timeout(20)
async def test_json_schema_pattern_properties_run_on_re2() -> None:
    schema = {
        "type": "object",
        "patternProperties": {EVIL: {"type": "integer"}},
        "additionalProperties": False,
    }
    started = time.monotonic()
    out = await verdicts(
        {"type": "json_schema", "schema": schema},
        [json.dumps({ATTACK: 1})] * 50 + ['{"aaa": 1}', '{"aaa": "x"}'],
    )
    assert time.monotonic() - started < 5
    assert [v.approved for v in out] == [False] * 50 + [True, False]
    assert "not match any of the regexes" in out[0].reason


@pytest.mark.timeout(20)
async def test_json_schema_property_names_run_on_re2() -> None:
    schema = {"type": "object", "propertyNames": {"pattern": EVIL}}
    out = await verdicts({"type": "json_schema", "schema": schema}, [json.dumps({ATTACK: 1}), '{"aa": 1}'])
    assert [v.approved for v in out] == [False, True]


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "pattern": r"(a)\1"},
        {"type": "object", "patternProperties": {r"^(?=x)": {}}},
        {"$defs": {"x": {"pattern": r"(?<=a)b"}}, "$ref": "#/$defs/x"},
    ],
)
def test_json_schema_patterns_re2_cannot_run_are_config_errors(schema: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="RE2"):
        judge_of({"type": "json_schema", "schema": schema})


def test_json_schema_unevaluated_properties_with_pattern_properties_is_refused() -> None:
    """jsonschema evaluates that pair with Python's backtracking ``re``: refused, not slow."""
    schema = {"type": "object", "patternProperties": {"^a": {}}, "unevaluatedProperties": False}
    with pytest.raises(ConfigError, match="unevaluatedProperties"):
        judge_of({"type": "json_schema", "schema": schema})


class SlowCheck(RuleJudge):
    kind = "slow"

    def check(self, item: JudgeItem) -> Verdict:
        time.sleep(0.1)  # a check that holds its thread (CPU-bound user code, a slow library)
        if item.result == "boom":
            raise RuntimeError("broken on this record")
        return Verdict(True, "ok")


async def test_rule_checks_run_off_the_event_loop() -> None:
    gaps: list[float] = []
    done = asyncio.Event()

    async def tick() -> None:
        last = time.monotonic()
        while not done.is_set():
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.05)
    out = await SlowCheck().judge(
        [JudgeItem({}, r, str(i)) for i, r in enumerate(["a", "boom", "c", "d"] * 3)]
    )
    done.set()
    await ticker
    assert max(gaps) < 0.2, f"the event loop stalled {max(gaps):.2f} s"
    assert [v.approved for v in out] == [True, False, True, True] * 3
    assert out[1].reason == "judge_error: RuntimeError: broken on this record"
