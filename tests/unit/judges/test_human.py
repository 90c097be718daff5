"""The human-judge rule, in one place: people judge between rounds, so no retry in place."""

from __future__ import annotations

import pytest

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges import JUDGE_TYPES, judges_in_place, require_judge_in_place


def test_every_judge_but_people_judges_in_place() -> None:
    assert [t for t in JUDGE_TYPES if not judges_in_place(t)] == ["human"]
    assert judges_in_place(None)  # no judge type (a spec the judge builder refuses on its own)


def test_the_refusal_names_what_would_retry_in_place_and_the_remedy() -> None:
    require_judge_in_place("llm", what="strategy 'hybrid'")
    with pytest.raises(
        ConfigError, match=r"^a human judge cannot retry in place \(strategy 'hybrid'\).*strategy rounds$"
    ):
        require_judge_in_place("human", what="strategy 'hybrid'")
