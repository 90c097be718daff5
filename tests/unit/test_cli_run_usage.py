"""``batchinfer run`` records the lease it takes as usage events (issue 40): its replicas when the
run starts, 0 when it ends (however it ends); a static pool (``--worker-url``) is not leased."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.cli import main
from airflow_batchinfer.cli import run as run_cli
from airflow_batchinfer.state.docs.usage import read_usage
from airflow_batchinfer.state.layout import RunLayout


class _Pool:
    backend = "local"

    def __str__(self) -> str:
        return "local://cli"

    def release(self, lease: str) -> int:
        return 0


def test_the_lease_is_recorded_at_the_start_and_released_at_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "run"
    (tmp_path / "in.jsonl").write_text('{"id": "a", "question": "q"}\n')
    seen: list[list[tuple[str, int]]] = []

    async def pipeline(*args: Any) -> dict[str, Any]:
        seen.append([(e.pool, e.replicas) for e in read_usage(RunLayout(str(root)))])
        raise RuntimeError("the run failed")

    monkeypatch.setattr(run_cli, "_open_pool", lambda args, cfg, lease: _Pool())
    monkeypatch.setattr(run_cli, "_pipeline", pipeline)
    with pytest.raises(RuntimeError):
        main(
            [
                "run",
                str(tmp_path / "in.jsonl"),
                str(root),
                "--replicas",
                "3",
                "--prompt-template",
                "{{ question }}",
            ]
        )
    assert seen == [[("local://cli", 3)]]  # leased while it ran
    events = read_usage(RunLayout(str(root)))
    assert [(e.kind, e.replicas) for e in events] == [("lease", 3), ("lease", 0)]  # released though it failed
