"""Issue 38, item 6: a directory of parts through ``batchinfer run`` on a real local pool: round 0
reads the parts in place, a bad line and an id repeated across parts are rejected once, naming their
part, and the id invariant holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_batchinfer.storage import JsonlFile
from tests.support.local_pool import cli, env  # noqa: F401 (fixtures, used by name)
from tests.support.parts import part_bytes, write_parts

pytestmark = pytest.mark.slow


def test_a_directory_input_goes_through_round_0_with_the_id_invariant(
    tmp_path: Path, env: dict[str, str]
) -> None:
    src = tmp_path / "data"
    write_parts(src, [150, 3, 0, 260, 40])
    (src / "_SUCCESS").write_bytes(b"")
    (src / "part-1.jsonl").write_bytes(part_bytes(150, 3) + b"oops\n")  # line 4 of part-1
    (src / "part-4.jsonl").write_bytes(part_bytes(413, 40) + part_bytes(0, 1))  # r0 again, line 41
    root = tmp_path / "run"
    args = ["--engine", "simulated", "--prompt-template", "What is {{ q }}?", "--judge", '{"type": "llm"}']
    out = cli("run", str(src), str(root), "--name", "parts", *args, "--records-per-shard", "100", env=env)
    try:
        assert out["invariant"]["ok"], out["invariant"]
        assert out["input"]["lines"] == 455 and out["input"]["quarantined"] == 1
        assert out["rounds"][0]["shards"] >= 5 and out["rounds"][0]["repeated_ids"] == 1
        assert out["approved"] + out["remaining_pending"] == 453  # 454 records, one a repeat
        files = sorted((root / "rejects").glob("*.jsonl.zst"))
        rejects = {r["error"][:10]: r for f in files for r in JsonlFile(str(f)).iter_records()}
        bad = rejects["invalid JS"]
        assert (bad["source"], bad["line_in_part"]) == (str(src / "part-1.jsonl"), 4)
        again = rejects["id 'r0' re"]
        assert (again["source"], again["line_in_part"], again["line_no"]) == (
            str(src / "part-4.jsonl"),
            41,
            455,
        )
    finally:
        cli("pool", "down", "--name", "parts", env=env)
