"""The desk's browser tests: one headless Chromium per module (the tests skip, saying why, without
one)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.browser import chromium


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b
