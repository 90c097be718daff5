"""Offline models for tests, cached under the repository's ignored ``.cache/``."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache"
VLLM_PYTHON = CACHE / "vllm-venv" / "bin" / "python"
