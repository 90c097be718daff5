"""JSON values read strictly: a number a row or a record carries is an ``int`` or ``float`` that is
not a ``bool`` (JSON's ``true`` is no count and no score)."""

from __future__ import annotations

from typing import Any

__all__ = ["number", "whole_number"]


def whole_number(value: Any) -> int | None:
    """``value`` when it is an integer (not a bool), else ``None``."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def number(value: Any) -> float | None:
    """``value`` as a float when it is a number (not a bool), else ``None``: a stored score."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
