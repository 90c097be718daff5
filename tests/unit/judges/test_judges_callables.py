"""Callable judges import code named in job params: a worker imports only targets its operator allowed
(``--allow-callable``), and checks that before anything is imported."""

from __future__ import annotations

import sys

import pytest

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.state.params import parse_params

pytestmark = pytest.mark.security

# A module nothing imports: if it shows up in sys.modules, a refused target was imported anyway.
CANARY = "this"


def _policy(entries: list[str]) -> object:
    from airflow_batchinfer.judges import CallablePolicy

    return CallablePolicy(entries)


@pytest.mark.parametrize(
    ("entries", "target", "ok"),
    [
        (["my_pkg.checks:is_good"], "my_pkg.checks:is_good", True),
        (["my_pkg.checks:is_good"], "my_pkg.checks:is_bad", False),
        (["my_pkg.checks:is_good"], "my_pkg.checks:is_good_too", False),
        (["my_pkg.checks:"], "my_pkg.checks:anything", True),
        (["my_pkg.checks:"], "my_pkg.checks2:anything", False),
        (["my_pkg."], "my_pkg.checks:f", True),
        (["my_pkg."], "my_pkg.sub.mod:f", True),
        (["my_pkg."], "my_pkg:f", False),
        (["my_pkg."], "my_pkg_evil.x:f", False),
        ([], "my_pkg.checks:is_good", False),
    ],
)
def test_policy_matches_whole_targets_or_prefixes_ending_in_a_separator(
    entries: list[str], target: str, ok: bool
) -> None:
    assert _policy(entries).allows(target) is ok  # type: ignore[attr-defined]


@pytest.mark.parametrize("entry", ["", "my_pkg", "a:b,c:d", " a:b"])
def test_policy_refuses_entries_that_are_not_targets_or_prefixes(entry: str) -> None:
    with pytest.raises(ConfigError, match="allow-callable"):
        _policy([entry])


def test_a_refused_target_is_never_imported() -> None:
    if CANARY in sys.modules:
        pytest.skip(f"{CANARY} was imported by another test")
    with pytest.raises(ConfigError, match="--allow-callable") as info:
        parse_params("judge", {"judge": {"type": "callable", "target": f"{CANARY}:x"}}, callables=_policy([]))
    assert f"{CANARY}:x" in str(info.value)
    assert CANARY not in sys.modules


def test_a_refused_target_inside_a_combined_judge() -> None:
    spec = {
        "type": "all",
        "judges": [{"type": "length"}, {"type": "callable", "target": "os:system"}],
    }
    with pytest.raises(ConfigError, match="'os:system' is not allowed"):
        parse_params("judge", {"judge": spec}, callables=_policy(["tests.support.judges:"]))


def test_an_allowed_target_is_built() -> None:
    params = parse_params(
        "judge",
        {"judge": {"type": "callable", "target": "tests.support.judges:approve_unless_stubborn"}},
        callables=_policy(["tests.support.judges:"]),
    )
    assert params.judge is not None
    assert params.judge.describe() == {
        "type": "callable",
        "target": "tests.support.judges:approve_unless_stubborn",
    }
