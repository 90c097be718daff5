"""A storage root for a test: local disk, or a fresh prefix on the S3 server (tests/component)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow_batchinfer.storage.location import resolve


@dataclass
class Root:
    """A fresh storage root on one backend: ``uri(name)`` makes child URIs."""

    base: str
    storage_options: dict[str, Any]
    backend: str

    def uri(self, *parts: str) -> str:
        return "/".join([self.base, *parts])


def visible_names(root: Root, sub: str = "") -> list[str]:
    loc = resolve(root.uri(sub) if sub else root.base, root.storage_options)
    try:
        return sorted(
            p.rstrip("/").rsplit("/", 1)[-1] for p in loc.fs.ls(loc.path, detail=False, refresh=True)
        )
    except FileNotFoundError:
        return []
