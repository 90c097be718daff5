"""One table of the sampling fields' bounds (``engines.sampling``): the engines' ``SamplingParams``
refuses what the run's ``sampling`` param and a review gate's form refuse, and takes what they take."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from airflow_batchinfer.engines.base import SamplingParams
from airflow_batchinfer.engines.sampling import SAMPLING_FIELDS, sampling_schema
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.settings import SAMPLING_PROPERTIES, setting

EDGES: dict[str, list[Any]] = {
    "max_tokens": [-1, 0, 1, 2, 100_000],
    "temperature": [-0.5, -1e-9, 0.0, 0.7, 2.0, 7.5],
    "top_p": [-0.1, 0.0, 1e-9, 0.5, 1.0, 1.0001],
}


def schema_takes(name: str, value: Any) -> bool:
    try:
        jsonschema.validate({name: value}, {"type": "object", "properties": SAMPLING_FIELDS})
    except jsonschema.ValidationError:
        return False
    return True


def engine_refusal(name: str, value: Any) -> str | None:
    try:
        SamplingParams.from_mapping({name: value})
    except ConfigError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("name", sorted(EDGES))
def test_the_engines_bounds_are_the_schemas(name: str) -> None:
    for value in EDGES[name]:
        refusal = engine_refusal(name, value)
        assert (refusal is None) == schema_takes(name, value), (name, value)
        assert refusal is None or (name in refusal and str(value) in refusal)  # names field and value


def test_the_run_settings_sampling_schema_is_the_table() -> None:
    assert SAMPLING_PROPERTIES == SAMPLING_FIELDS
    assert setting("sampling").schema()["properties"] == SAMPLING_FIELDS
    assert schema_takes("max_completion_tokens", 1) and not schema_takes("max_completion_tokens", 0)


def test_a_review_gate_takes_the_sampling_params_bounds() -> None:
    from airflow_batchinfer.run.gate import GATE_SCHEMAS

    for name in ("temperature", "max_tokens"):
        assert GATE_SCHEMAS[name] == sampling_schema(name), name
