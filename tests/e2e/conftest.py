"""End-to-end tests on a real Airflow 3.3.2 (the session's ``airflow`` fixture, in tests/conftest.py,
shared with the security tests). Runs are triggered and reviews answered through the REST API only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import JUDGE_POOL_SLOTS, POOL_SLOTS

pytest.importorskip("airflow", reason="needs the airflow extra")

__all__ = ["JUDGE_POOL_SLOTS", "POOL_SLOTS", "write_dataset"]


def write_dataset(path: Path, n: int, prefix: str = "r") -> list[str]:
    ids = [f"{prefix}{i:04d}" for i in range(n)]
    with path.open("w") as f:
        for i, rid in enumerate(ids):
            f.write(json.dumps({"id": rid, "question": f"question {i}"}) + "\n")
    return ids
