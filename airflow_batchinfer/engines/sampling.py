"""The sampling fields the engines read, with their bounds: one table.

:class:`~airflow_batchinfer.engines.base.SamplingParams` refuses what is out of bounds here; the
run settings' ``sampling`` schema (``settings.SAMPLING_PROPERTIES``) and the review gate's form
(``operators/rounds.py``) are built from the same table, so a value the trigger form or a gate
takes is one the workers take. Other fields of a sampling mapping are ignored.

This module imports nothing (the run settings and the worker side both import it).
"""

from __future__ import annotations

import copy
from typing import Any

#: The JSON schema of each field (nullable: ``null`` means "the default"); SamplingParams checks
#: the same bounds (:func:`bounds_refusal`).
SAMPLING_FIELDS: dict[str, dict[str, Any]] = {
    "max_tokens": {"type": ["integer", "null"], "minimum": 1},
    "max_completion_tokens": {"type": ["integer", "null"], "minimum": 1},
    "temperature": {"type": ["number", "null"], "minimum": 0},
    "top_p": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1},
    "seed": {"type": ["integer", "null"]},
    "stop": {"type": ["string", "array", "null"], "items": {"type": "string"}},
}


def sampling_schema(name: str) -> dict[str, Any]:
    """The JSON schema of the sampling field ``name`` (a copy)."""
    return copy.deepcopy(SAMPLING_FIELDS[name])


def sampling_schemas() -> dict[str, dict[str, Any]]:
    """Every field's JSON schema (copies): the ``properties`` of a ``sampling`` object."""
    return copy.deepcopy(SAMPLING_FIELDS)


def bounds_refusal(name: str, value: float) -> str | None:
    """Why ``value`` is out of the sampling field ``name``'s bounds (``None``: it is within), e.g.
    ``"top_p must be in (0, 1], got 0"``."""
    schema = SAMPLING_FIELDS[name]
    low, low_open = schema.get("minimum"), False
    if "exclusiveMinimum" in schema:
        low, low_open = schema["exclusiveMinimum"], True
    high = schema.get("maximum")
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and value > high
    if not (too_low or too_high):
        return None
    if low is not None and high is not None:
        return f"{name} must be in {'(' if low_open else '['}{low}, {high}], got {value}"
    if low is not None:
        return f"{name} must be {'>' if low_open else '>='} {low}, got {value}"
    return f"{name} must be <= {high}, got {value}"
