"""What a review gate may change: its keys and their schemas come from the run settings (a gate takes
what a trigger takes, and the engines take what a gate takes), and a round's settings with a
review's changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest

from airflow_batchinfer.engines.base import SamplingParams
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.run.gate.changes import GATE_CHANGES, GATE_SCHEMAS, MAX_GATE_TEXT, current_settings
from airflow_batchinfer.spec.settings import setting
from airflow_batchinfer.state.config import RunConfig, round_config

EDGES: dict[str, list[Any]] = {
    "temperature": [-1, -1e-9, 0, 0.7, 2.0, 5.0, 7.5, None],
    "max_tokens": [-1, 0, 1, 2, 100_000, None],
}


def takes(schema: dict[str, Any], value: Any) -> bool:
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError:
        return False
    return True


def engines_take(name: str, value: Any) -> bool:
    try:
        SamplingParams.from_mapping({name: value})
    except ConfigError:
        return False
    return True


@pytest.mark.parametrize("name", sorted(EDGES))
def test_the_gates_sampling_bounds_are_the_params_and_the_engines(name: str) -> None:
    params = setting("sampling").schema()["properties"][name]
    assert GATE_SCHEMAS[name] == params, name
    for value in EDGES[name]:
        assert takes(GATE_SCHEMAS[name], value) == takes(params, value) == engines_take(name, value), value


def test_the_gates_texts_take_what_the_trigger_form_takes_within_a_bound() -> None:
    for name in ("prompt_template", "system", "retry_template"):
        params = {k: v for k, v in setting(name).schema().items() if k != "description"}
        assert GATE_SCHEMAS[name] == {**params, "maxLength": MAX_GATE_TEXT}, name
        assert takes(GATE_SCHEMAS[name], None) and takes(GATE_SCHEMAS[name], "{{ q }}")
        assert not takes(GATE_SCHEMAS[name], "x" * (MAX_GATE_TEXT + 1))
    assert not takes(GATE_SCHEMAS["prompt_template"], "")  # as the trigger form: empty is null
    assert set(GATE_SCHEMAS) == set(GATE_CHANGES) == {
        "temperature", "max_tokens", "prompt_template", "system", "retry_template"
    }  # fmt: skip


def run(tmp_path: Path) -> RunConfig:
    return RunConfig.of(
        input=str(tmp_path / "in.jsonl"),
        run_root=str(tmp_path / "run"),
        prompt_template="{{ q }}",
        judge={"type": "llm"},
        sampling={"temperature": 0.7, "max_tokens": 8},
    )


def test_a_rounds_settings_are_run_json_with_the_reviews_changes(tmp_path: Path) -> None:
    cfg = run(tmp_path)
    assert round_config(cfg, None) is cfg and round_config(cfg, {}) is cfg
    changed = round_config(cfg, {"temperature": 1.3, "system": "Be brief."})
    assert current_settings(changed) == {
        "temperature": 1.3, "max_tokens": 8, "prompt_template": "{{ q }}", "system": "Be brief.",
        "retry_template": None,
    }  # fmt: skip
    told = round_config(cfg, {"retry_template": "{{ q }} (not {{ previous.result }})"})
    assert (
        told.retries.retry_template == "{{ q }} (not {{ previous.result }})"
        and cfg.retries.retry_template is None
    )
    # the next rounds' jobs run it, and run.json's settings stay
    assert told.infer_params().wire()["retry_template"] == told.retries.retry_template
    assert cfg.prompt.sampling == {"temperature": 0.7, "max_tokens": 8} and cfg.prompt.system is None
    with pytest.raises(ConfigError):  # validated as the workers will: a template they cannot render
        round_config(cfg, {"prompt_template": "{{ q"})
    with pytest.raises(ConfigError, match="invalid prompt template"):
        round_config(cfg, {"retry_template": "{{ previous.result"})
