from __future__ import annotations

from typing import Any

import pytest

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.state.params import parse_params


def test_defaults_per_kind() -> None:
    infer = parse_params("infer", {"prompt_template": "{{ q }}"})
    assert infer.chunk_size == 2000 and infer.prompts is not None and infer.judge is None
    judge = parse_params("judge", {"judge": {"type": "length"}})
    assert judge.judge is not None and judge.prompts is None
    inplace = parse_params("in_place", {"judge": {"type": "llm"}, "max_attempts": 5})
    assert (inplace.max_attempts, inplace.checkpoint_every, inplace.checkpoint_interval_s) == (5, 256, 5.0)


@pytest.mark.parametrize(
    ("kind", "params", "match"),
    [
        ("infer", {"chunk_size": 0}, "chunk_size"),
        ("infer", {"chunk_size": True}, "chunk_size"),
        ("infer", {"prompt_template": 3}, "prompt_template"),
        ("infer", {"output_format": "csv"}, "output_format"),
        ("infer", {"sampling": {"max_tokens": 0}}, "max_tokens"),
        ("judge", {}, "needs params.judge"),
        ("in_place", {"judge": {"type": "llm"}, "max_attempts": 0}, "max_attempts"),
        ("in_place", {"judge": {"type": "llm"}, "checkpoint_interval_s": 0}, "checkpoint_interval_s"),
        ("judge", {"judge": {"type": "nope"}}, "unknown"),
    ],
)
def test_bad_params_name_the_field(kind: str, params: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_params(kind, params)


def test_a_human_judge_judges_between_rounds_never_in_a_job_that_retries_in_place() -> None:
    assert parse_params("judge", {"judge": {"type": "human"}}).judge is not None  # a round's judge job
    with pytest.raises(ConfigError, match=r"cannot retry in place \(an in_place job\).*strategy rounds"):
        parse_params("in_place", {"judge": {"type": "human"}})
