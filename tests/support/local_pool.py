"""The ``batchinfer pool`` CLI in a subprocess and a dataset for it: the local pool's component tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


def cli(*args: str, env: dict[str, str], timeout: float = 300) -> dict[str, Any]:
    out = subprocess.run([BIN, *args], capture_output=True, text=True, env=env, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def dataset(tmp_path: Path, n: int) -> Path:
    src = tmp_path / "data" / "arith.jsonl"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text(
        "".join(
            json.dumps({"id": f"q{i}", "question": f"{i} + {i}", "answer": 2 * i}) + "\n" for i in range(n)
        )
    )
    return src


BIN = str(Path(sys.executable).parent / "batchinfer")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "BATCHINFER_CACHE": str(tmp_path / "cache")}
