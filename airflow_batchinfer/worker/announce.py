"""A worker's announcement: the file it writes (``--announce-file``) the moment it serves, with the
engine loaded, which a local pool waits for instead of polling the worker; and the process's
start-up marks it carries.

The document (:class:`Announcement`, version :data:`ANNOUNCE_VERSION`)::

    {"version": 1, "url": "http://127.0.0.1:PORT", "pid": 123, "started_at": 1764680000.1,
     "startup": {"imports": ..., "app": ..., "engine": ..., "listening": ..., "announced": ...},
     "model_source": "cache"}

``startup`` holds wall-clock times (``time.time()``) of the marks in :data:`STARTUP_MARKS`, noted by
:func:`mark` as the process gets there: its modules imported, the app built, the engine loaded,
the socket listening, the announcement written. ``model_source`` says where the engine loaded the
model from (:mod:`~airflow_batchinfer.worker.model_cache`: ``cache`` or ``model``; absent for an
engine without a model path). Another version (or none), an unknown field or a bad value is
refused by name.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_batchinfer.exceptions import ConfigError

ANNOUNCE_VERSION = 1
STARTUP_MARKS = ("imports", "app", "engine", "listening", "announced")
_FIELDS = frozenset({"version", "url", "pid", "started_at", "startup", "model_source"})
MODEL_SOURCES = ("cache", "model")
REMEDY = (
    "Remedy: stop the pool's workers (`batchinfer pool down --name NAME`) and start them again "
    "with this release"
)

_marks: dict[str, float] = {}
_source: dict[str, str] = {}


def mark(name: str) -> None:
    """Note the time this process reached start-up mark ``name`` (its first time only)."""
    if name not in STARTUP_MARKS:
        raise ValueError(f"unknown start-up mark {name!r}: one of {', '.join(STARTUP_MARKS)}")
    _marks.setdefault(name, time.time())


def marks() -> dict[str, float]:
    """The start-up marks this process has reached so far."""
    return dict(_marks)


def note_model_source(source: str) -> None:
    """Note where this process's engine loads its model from (``cache`` or ``model``)."""
    if source not in MODEL_SOURCES:
        raise ValueError(f"unknown model source {source!r}: one of {', '.join(MODEL_SOURCES)}")
    _source["model"] = source


def model_source() -> str | None:
    """Where this process's engine loaded its model from (``None``: not noted)."""
    return _source.get("model")


@dataclass(frozen=True)
class Announcement:
    url: str
    pid: int
    started_at: float
    startup: Mapping[str, float] = field(default_factory=dict)
    model_source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        doc = {
            "version": ANNOUNCE_VERSION,
            "url": self.url,
            "pid": self.pid,
            "started_at": self.started_at,
            "startup": dict(self.startup),
        }
        return doc if self.model_source is None else {**doc, "model_source": self.model_source}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Announcement:
        """From a stored announcement; ``where`` (its path) names it in errors."""

        def refused(why: str) -> ConfigError:
            return ConfigError(f"worker announcement {where}: {why}. {REMEDY}")

        if not isinstance(data, dict):
            raise refused(f"expected a JSON object, got {type(data).__name__}")
        version = data.get("version")
        if version != ANNOUNCE_VERSION:
            raise refused(f"version {version!r}; this release reads version {ANNOUNCE_VERSION}")
        if unknown := sorted(set(data) - _FIELDS):
            raise refused(f"unknown fields {unknown}")
        url, pid, started_at = data.get("url"), data.get("pid"), data.get("started_at")
        startup = data.get("startup", {})
        if not isinstance(url, str) or not url.startswith("http"):
            raise refused(f"url {url!r} is not an http URL")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            raise refused(f"pid {pid!r} is not a process id")
        if not isinstance(started_at, (int, float)) or isinstance(started_at, bool):
            raise refused(f"started_at {started_at!r} is not a time")
        if not isinstance(startup, dict) or not all(
            k in STARTUP_MARKS and isinstance(v, (int, float)) and not isinstance(v, bool)
            for k, v in startup.items()
        ):
            raise refused(f"startup {startup!r}: expected times of the marks {', '.join(STARTUP_MARKS)}")
        source = data.get("model_source")
        if source is not None and source not in MODEL_SOURCES:
            raise refused(f"model_source {source!r} is not one of {', '.join(MODEL_SOURCES)}")
        return cls(url, pid, float(started_at), {k: float(v) for k, v in startup.items()}, source)


def announce(path: str | Path, url: str) -> Announcement:
    """Write this process's announcement (atomically: a reader sees all of it or none) with its
    start-up marks, ``announced`` included."""
    mark("announced")
    doc = Announcement(
        url=url, pid=os.getpid(), started_at=_marks["announced"], startup=marks(), model_source=model_source()
    )
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc.to_dict(), f)
    os.replace(tmp, path)
    return doc


def read_announcement(path: str | Path) -> Announcement | None:
    """The announcement in ``path``; ``None`` while there is none (the worker is still starting, or
    it exited and removed it)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"worker announcement {path}: not JSON ({exc}). {REMEDY}") from None
    return Announcement.from_dict(data, str(path))
