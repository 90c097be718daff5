"""What a review gate's answer may change for the next rounds: the keys (:data:`GATE_CHANGES`, run
settings and sampling fields, with their schemas from the run settings), the values a gate's form
shows, what an answer changes and the deployment's caps over it. The settings a round runs with the
changes are :func:`~airflow_batchinfer.state.config.round_config`'s (the plan step's)."""

from __future__ import annotations

from typing import Any, Literal

from airflow_batchinfer.engines.sampling import SAMPLING_FIELDS, sampling_schema
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.spec.limits import TriggerLimits, refusals
from airflow_batchinfer.spec.settings import setting
from airflow_batchinfer.state.config import ROUND_SETTINGS, RunConfig

# What a reviewer may change for the next rounds with a gate's answer (state.config.ROUND_SETTINGS),
# and where each lives in the run's settings: a field of the ``sampling`` setting (engines.sampling
# holds its bounds) or a run setting of its own (settings.RUN_SETTINGS_SPEC holds its schema).
GATE_CHANGES: dict[str, Literal["sampling", "setting"]] = {
    key: "sampling" if key in SAMPLING_FIELDS else "setting" for key in ROUND_SETTINGS
}
# A text answer's bound: Airflow stores the gate's answer in its metadata database.
MAX_GATE_TEXT = 100_000


def _schema(key: str) -> dict[str, Any]:
    """The JSON schema of ``key`` in the gate's form: the run settings' (a gate takes what a trigger
    takes), a text at most :data:`MAX_GATE_TEXT` long."""
    if GATE_CHANGES[key] == "sampling":
        return sampling_schema(key)
    schema = {k: v for k, v in setting(key).schema().items() if k != "description"}
    return {**schema, "maxLength": MAX_GATE_TEXT}


GATE_SCHEMAS: dict[str, dict[str, Any]] = {key: _schema(key) for key in GATE_CHANGES}


def changed_settings(previous: dict[str, Any] | None, changes: dict[str, Any]) -> dict[str, Any] | None:
    """``previous`` (a plan's settings) with a reviewer's ``changes`` (``None``: unchanged), checked."""
    unknown = set(changes) - set(GATE_CHANGES)
    if unknown:
        raise ConfigError(f"a review may change {sorted(GATE_CHANGES)}, not {sorted(unknown)}")
    settings = {**(previous or {}), **{k: v for k, v in changes.items() if v is not None}}
    return settings or None


def current_settings(cfg: RunConfig) -> dict[str, Any]:
    """The values of :data:`GATE_CHANGES` that ``cfg`` runs with (what a gate's form shows)."""
    return {
        k: (cfg.prompt.sampling.get(k) if where == "sampling" else cfg.setting(k))
        for k, where in GATE_CHANGES.items()
    }


def gate_changes(current: dict[str, Any], answered: dict[str, Any]) -> dict[str, Any]:
    """What a gate's answer changes: the answered values that are set and differ from ``current``."""
    return {k: v for k, v in answered.items() if k in GATE_CHANGES and v is not None and v != current.get(k)}


def gate_refusals(changed: RunConfig, settings: dict[str, Any], limits: TriggerLimits) -> list[str]:
    """Why the settings a review changed go over the deployment's caps (``[]``: they do not), decided
    by :func:`~airflow_batchinfer.spec.limits.refusals` as for a trigger's params. ``changed``: the config
    the next rounds would run (a sampling key is checked with the whole sampling, as the engines read
    it: ``max_completion_tokens`` before ``max_tokens``, 256 when neither is set)."""
    params = {k: changed.setting(k) for k in settings if GATE_CHANGES[k] != "sampling"}
    if any(GATE_CHANGES[k] == "sampling" for k in settings):
        params["sampling"] = changed.prompt.sampling
    return refusals(params, limits)
