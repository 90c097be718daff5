from __future__ import annotations

from typing import Any

import pytest

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges import CallablePolicy, JudgeItem, Verdict, build_judge

HERE = CallablePolicy([f"{__name__}:"])  # this module's functions, and nothing else


async def decide(spec: dict[str, Any], record: dict[str, Any], result: str) -> Verdict:
    (verdict,) = await build_judge(spec, callables=HERE).judge([JudgeItem(record, result, "1")])
    return verdict


@pytest.mark.parametrize(
    ("match", "expected", "output", "ok"),
    [
        ("number", 4, "2 + 2 = 4", True),
        ("number", "1,234", "The total is 1,234.", True),
        ("number", 4, "It is 5, not 4? no: 5", False),
        ("number", 4, "four", False),
        ("exact", "Paris", "  paris ", True),
        ("exact", "Paris", "Paris, France", False),
        ("contains", "Paris", "The capital is Paris.", True),
    ],
)
async def test_expected_answer(match: str, expected: Any, output: str, ok: bool) -> None:
    spec = {"type": "expected_answer", "field": "answer", "match": match}
    assert (await decide(spec, {"answer": expected}, output)).approved is ok


async def test_expected_answer_missing_field_rejects_with_reason() -> None:
    v = await decide({"type": "expected_answer"}, {}, "4")
    assert not v.approved and "no 'answer' field" in v.reason


async def test_regex_json_schema_length() -> None:
    assert (await decide({"type": "regex", "pattern": r"^\d+$"}, {}, "42")).approved
    assert not (await decide({"type": "regex", "pattern": "bad", "must_match": False}, {}, "so bad")).approved
    schema = {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}
    assert (
        await decide({"type": "json_schema", "schema": schema}, {}, '```json\n{"name": "x"}\n```')
    ).approved
    v = await decide({"type": "json_schema", "schema": schema}, {}, '{"nom": 1}')
    assert not v.approved and "name" in v.reason
    assert "not JSON" in (await decide({"type": "json_schema", "schema": schema}, {}, "nope")).reason
    assert not (await decide({"type": "length", "min_chars": 5}, {}, "abc")).approved
    assert (await decide({"type": "length", "min_chars": 1, "max_chars": 5}, {}, "abc")).approved


def good_if_even(record: dict[str, Any], result: str) -> Any:
    return {"approved": int(result) % 2 == 0, "reason": "parity", "score": 1}


def broken(record: dict[str, Any], result: str) -> Any:
    raise RuntimeError("bug in user code")


async def test_callable_judge_and_its_failures() -> None:
    assert (await decide({"type": "callable", "target": f"{__name__}:good_if_even"}, {}, "4")).approved
    v = await decide({"type": "callable", "target": f"{__name__}:broken"}, {}, "4")
    assert not v.approved and "bug in user code" in v.reason
    with pytest.raises(ConfigError, match="cannot import"):
        build_judge({"type": "callable", "target": "no_such_module:fn"}, callables=None)
    with pytest.raises(ConfigError, match="is not allowed"):
        build_judge({"type": "callable", "target": "no_such_module:fn"}, callables=HERE)


async def test_all_and_any_compose() -> None:
    both = {
        "type": "all",
        "judges": [{"type": "regex", "pattern": r"\d"}, {"type": "length", "max_chars": 3}],
    }
    either = {**both, "type": "any"}
    assert (await decide(both, {}, "12")).approved
    assert not (await decide(both, {}, "12345")).approved
    assert (await decide(either, {}, "12345")).approved
    assert not (await decide(either, {}, "abcdef")).approved


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"kind": "llm"}, "'type'"),
        ({"type": "magic"}, "unknown"),
        ({"type": "regex", "pattern": "("}, "invalid pattern"),
        ({"type": "json_schema", "schema": {"type": "nope"}}, "invalid schema"),
        ({"type": "length", "min_chars": 5, "max_chars": 1}, "min_chars"),
        ({"type": "expected_answer", "match": "fuzzy"}, "match"),
        ({"type": "regex", "patern": "x"}, "bad arguments"),
        ({"type": "all", "judges": []}, "at least one"),
    ],
)
def test_bad_specs_are_config_errors(spec: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        build_judge(spec, callables=HERE)
