"""Judges importable by test workers (``callable`` judge targets)."""

from __future__ import annotations

from typing import Any


def approve_unless_stubborn(record: dict[str, Any], result: str) -> tuple[bool, str]:
    if record.get("id") == "stubborn":
        return False, "this one never passes"
    return True, "fine"
