"""The worker's announcement document: what it writes, what a pool accepts and refuses."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.worker import announce as ann
from airflow_batchinfer.worker.announce import (
    ANNOUNCE_VERSION,
    STARTUP_MARKS,
    announce,
    read_announcement,
)


@pytest.fixture(autouse=True)
def fresh_marks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ann, "_marks", {})
    monkeypatch.setattr(ann, "_source", {})


def test_the_announcement_carries_the_start_marks_and_reads_back(tmp_path: Path) -> None:
    for name in STARTUP_MARKS[:-1]:
        ann.mark(name)
    path = tmp_path / "worker-a.json"
    written = announce(path, "http://127.0.0.1:4321")
    data = json.loads(path.read_text())
    assert data["version"] == ANNOUNCE_VERSION and data["pid"] == os.getpid()
    assert list(data["startup"]) == list(STARTUP_MARKS)  # every mark, announced last
    assert data["started_at"] == data["startup"]["announced"]
    assert read_announcement(path) == written
    assert [p.name for p in tmp_path.iterdir()] == ["worker-a.json"]  # no temp file left


def test_the_announcement_says_where_the_model_came_from(tmp_path: Path) -> None:
    path = tmp_path / "worker-a.json"
    assert "model_source" not in announce(path, "http://127.0.0.1:1").to_dict()  # none noted: left out
    ann.note_model_source("cache")
    written = announce(path, "http://127.0.0.1:1")
    assert json.loads(path.read_text())["model_source"] == "cache"
    assert read_announcement(path) == written and written.model_source == "cache"
    with pytest.raises(ValueError, match="unknown model source 'disk'"):
        ann.note_model_source("disk")


def test_a_mark_keeps_its_first_time_and_unknown_marks_are_refused() -> None:
    ann.mark("imports")
    first = ann.marks()["imports"]
    ann.mark("imports")
    assert ann.marks() == {"imports": first}
    with pytest.raises(ValueError, match="unknown start-up mark 'ready'"):
        ann.mark("ready")


def test_no_file_yet_is_none(tmp_path: Path) -> None:
    assert read_announcement(tmp_path / "missing.json") is None


V = {"version": ANNOUNCE_VERSION}


@pytest.mark.parametrize(
    ("doc", "why"),
    [
        ({"version": 2, "url": "http://h:1", "pid": 1, "started_at": 1.0}, "version 2; this release reads"),
        ({"url": "http://h:1", "pid": 12, "started_at": 1.5}, "version None; this release reads"),
        ({**V, "url": "http://h:1", "pid": 1, "started_at": 1.0, "port": 1}, "unknown fields \\['port'\\]"),
        ({**V, "url": "h:1", "pid": 1, "started_at": 1.0}, "url 'h:1' is not an http URL"),
        ({**V, "url": "http://h:1", "pid": True, "started_at": 1.0}, "pid True is not a process id"),
        ({**V, "url": "http://h:1", "pid": 1, "started_at": "now"}, "started_at 'now' is not a time"),
        ({**V, "url": "http://h:1", "pid": 1, "started_at": 1.0, "startup": {"boot": 1.0}}, "startup"),
        ({**V, "url": "http://h:1", "pid": 1, "started_at": 1.0, "model_source": "s3"}, "model_source 's3'"),
        ([1, 2], "expected a JSON object, got list"),
    ],
)
def test_a_bad_announcement_is_refused_with_its_path_and_the_remedy(
    tmp_path: Path, doc: object, why: str
) -> None:
    path = tmp_path / "worker-x.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=why) as err:
        read_announcement(path)
    assert str(path) in str(err.value) and "batchinfer pool down" in str(err.value)


def test_an_announcement_that_is_not_json_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "worker-x.json"
    path.write_text("{url")
    with pytest.raises(ConfigError, match=f"{path}: not JSON"):
        read_announcement(path)
