"""A local pool passes its callable-judge allow-list to every worker it starts (``--allow-callable``
per entry), keeps it in pool.json (restarted workers get it too), and the list is part of the spec key
(a pool with another list is another generation)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.pools import local_workers
from airflow_batchinfer.pools.local import LocalPool, LocalPoolSpec

pytestmark = pytest.mark.security


class FakeProcess:
    """Stands in for a worker process: alive until ``exit()``."""

    next_pid = 4_000_000

    def __init__(self, cmd: list[str], **kwargs: Any) -> None:
        FakeProcess.next_pid += 1
        self.pid = FakeProcess.next_pid
        self.cmd = cmd
        self.code: int | None = None

    def poll(self) -> int | None:
        return self.code


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[FakeProcess]:
    procs: list[FakeProcess] = []

    def popen(cmd: list[str], **kwargs: Any) -> FakeProcess:
        procs.append(FakeProcess(cmd, **kwargs))
        return procs[-1]

    monkeypatch.setattr(local_workers.subprocess, "Popen", popen)
    monkeypatch.setattr(local_workers, "_CHILDREN", {})
    return procs


def allowed(cmd: list[str]) -> list[str]:
    return [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--allow-callable"]


def test_workers_start_with_the_allow_list_and_restart_with_it(
    tmp_path: Path, started: list[FakeProcess]
) -> None:
    spec = LocalPoolSpec(
        allowed_prefixes=(str(tmp_path),), allowed_callables=("my_pkg.checks:is_good", "b:c")
    )
    pool = LocalPool("p", state_dir=tmp_path / "pools")
    pool.start(spec, lease_id="run-1")
    assert allowed(started[0].cmd) == ["my_pkg.checks:is_good", "b:c"]
    stored = json.loads(pool.state_file.read_text())
    (gen,) = stored["generations"].values()
    assert LocalPoolSpec.from_dict(gen["spec"]) == spec  # round-trips through pool.json
    started[0].code = 1  # the worker died: keep() restarts it from the stored spec
    assert pool.keep("run-1")
    assert allowed(started[1].cmd) == ["my_pkg.checks:is_good", "b:c"]


def test_no_allow_list_no_flag(tmp_path: Path, started: list[FakeProcess]) -> None:
    LocalPool("p", state_dir=tmp_path / "pools").start(LocalPoolSpec(allowed_prefixes=(str(tmp_path),)))
    assert "--allow-callable" not in started[0].cmd


def test_allow_list_is_in_the_key_and_old_pool_files_load(tmp_path: Path) -> None:
    base = LocalPoolSpec(allowed_prefixes=("/data/",))
    allowing = LocalPoolSpec(allowed_prefixes=("/data/",), allowed_callables=("m:f",))
    assert base.key() != allowing.key()
    old = {k: v for k, v in dataclasses.asdict(base).items() if k != "allowed_callables"}
    assert LocalPoolSpec.from_dict(old) == base  # a pool.json written before the field existed
    assert LocalPoolSpec.from_dict(old).key() == base.key()
    back = LocalPoolSpec.from_dict(json.loads(json.dumps(dataclasses.asdict(allowing))))
    assert back == allowing and back.allowed_callables == ("m:f",)


@pytest.mark.parametrize("entry", ["", "a:b,c:d", "a: b"])
def test_bad_entries_are_refused(entry: str) -> None:
    with pytest.raises(ConfigError, match="allowed_callables"):
        LocalPoolSpec(allowed_prefixes=("/data/",), allowed_callables=(entry,))
