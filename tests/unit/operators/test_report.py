"""The pre-flight's task side (``preflight_check``): what the settings warn of is logged, also with the
sample turned off (no pool is held then)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

pytest.importorskip("airflow", reason="needs the airflow extra")

from airflow_batchinfer.operators.report import preflight_check
from airflow_batchinfer.state.config import RunConfig


def test_the_settings_warning_is_logged_before_the_sample(caplog: pytest.LogCaptureFixture) -> None:
    settings: dict[str, Any] = {"input": "/d/in.jsonl", "run_root": "/runs/r", "judge": {"type": "llm"}}
    cfg = RunConfig.of(prompt_template="{{ q }}", preflight_records=0, **settings)
    log = logging.getLogger("test.preflight")
    with caplog.at_level(logging.INFO, logger="test.preflight"):
        assert preflight_check(cfg, "local://unused", {}, {}, log) is None  # type: ignore[arg-type]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and warned[0].startswith("pre-flight: every retry would produce the same text")
    caplog.clear()
    retry = "{{ q }} (not {{ previous.result }})"
    told = RunConfig.of(prompt_template="{{ q }}", preflight_records=0, retry_template=retry, **settings)
    with caplog.at_level(logging.INFO, logger="test.preflight"):
        preflight_check(told, "local://unused", {}, {}, log)  # type: ignore[arg-type]
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
