"""Reason groups: the normalisation of judge reasons and the capped, deterministic counter."""

from __future__ import annotations

import pytest

from airflow_batchinfer.judges.reasons import (
    MAX_GROUPS,
    MAX_KEY_CHARS,
    NO_REASON,
    OTHER,
    ReasonGroups,
    reason_group,
    row_reason,
)


@pytest.mark.parametrize(
    ("reason", "group"),
    [
        ("expected 14, got 5", "expected #, got #"),
        ("expected 8, got 3", "expected #, got #"),
        ("expected -4.5, got 1,234", "expected #, got #"),
        ("expected 1,234,567 got 0.25 and .5 and 1e-5", "expected # got # and # and #"),
        ("range 3-5 is off by -2", "range #-# is off by #"),
        ('missing field "answer"', 'missing field "…"'),
        ("expected 'Paris', got 'paris'", 'expected "…", got "…"'),
        ("don't use 'x' here", 'don\'t use "…" here'),  # an apostrophe is no quote
        ('quoted "a \\"b\\" 12" then 3', 'quoted "…" then #'),
        ("  several\n\tspaces   here ", "several spaces here"),
        ("Case Is Kept", "Case Is Kept"),
        ("", NO_REASON),
        ("   ", NO_REASON),
        ("inference_error: timeout after 30.5s", "inference_error: timeout after #s"),
        ("inference_error: request 3f2a9c1e7b failed", "inference_error: request # failed"),
        ("inference_error: id 123e4567-e89b-12d3-a456-426614174000", "inference_error: id #"),
        ("invalid_judgment", "invalid_judgment"),
    ],
)
def test_reason_group_normalises(reason: str, group: str) -> None:
    assert reason_group(reason) == group


def test_long_reasons_are_cut_to_a_bounded_key() -> None:
    key = reason_group("word " * 200)
    assert len(key) == MAX_KEY_CHARS and key.endswith("…")
    assert reason_group("word " * 200 + "tail 1") == reason_group("word " * 200 + "tail 2")
    long_error = reason_group("inference_error: " + "x" * 500)
    assert long_error.startswith("inference_error: x") and len(long_error) == MAX_KEY_CHARS


def test_counter_orders_by_count_then_key_and_caps_with_other() -> None:
    groups = ReasonGroups()
    for reason in ["expected 1, got 2", "b", "a", "expected 3, got 4", "a"]:
        groups.add(reason)
    assert list(groups.as_dict().items()) == [("a", 2), ("expected #, got #", 2), ("b", 1)]
    many = ReasonGroups()
    for g in range(MAX_GROUPS + 10):
        many.add_group(f"g{g:03d}", 100 - g)
    capped = many.as_dict()
    assert len(capped) == MAX_GROUPS + 1 and list(capped)[-1] == OTHER
    assert capped[OTHER] == sum(100 - g for g in range(MAX_GROUPS, MAX_GROUPS + 10))
    assert sum(capped.values()) == many.total() == sum(100 - g for g in range(MAX_GROUPS + 10))


def test_merge_adds_dicts_and_counters_and_keeps_other_out_of_the_ranking() -> None:
    a = ReasonGroups({"x": 3, OTHER: 5})
    b = ReasonGroups().merge({"x": 1, "y": 2})
    a.merge(b)
    assert a.as_dict() == {"x": 4, "y": 2, OTHER: 5}
    assert a.as_dict(limit=1) == {"x": 4, OTHER: 7}
    assert ReasonGroups().as_dict() == {} and not ReasonGroups()


def test_counter_memory_is_bounded_and_totals_stay_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_batchinfer.judges import reasons

    monkeypatch.setattr(reasons, "MAX_TRACKED", 100)
    groups = ReasonGroups()
    for i in range(1_000):
        if i % 10 == 0:
            groups.add("common", 5)
        else:
            groups.add("unique " + "".join(chr(ord("a") + int(d)) for d in str(i)))  # no digits: distinct
    assert len(groups.counts) <= 101 and groups.total() == 100 * 5 + 900
    assert groups.as_dict()["common"] == 500


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"judgment": {"reason": "expected 4, got 5"}}, "expected 4, got 5"),
        ({"judgment": {"reason": {"missing": ["a", "b"]}}}, '{"missing":["a","b"]}'),  # a judge's JSON
        ({"judgment": {"reason": 0}}, "0"),
        ({"judgment": {"reason": None}}, ""),
        ({"judgment": "not a judgment"}, ""),
        ({}, ""),
    ],
)
def test_a_rows_reason_is_one_text_for_the_workers_counts_and_the_desk(row: dict, reason: str) -> None:
    assert row_reason(row) == reason
