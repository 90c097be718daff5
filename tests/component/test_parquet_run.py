"""``output_format: parquet`` end to end: a real multi-round ``batchinfer run`` on the local pool, over
a JSONL file and over a directory of Parquet parts, whose results read as one dataset by pyarrow,
DuckDB and pandas with the input's fields as typed columns of their own, whose rejected rows are
recompacted into the next round, whose report and id invariant hold, and whose re-run resumes (no job
runs twice)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from tests.support.local_pool import cli, dataset, env  # noqa: F401 (fixtures, used by name)

pytestmark = pytest.mark.slow


def _parquet_parts(tmp_path: Path, n: int) -> Path:
    """The same records as ``dataset`` as three Parquet parts (a Hugging Face-like layout)."""
    d = tmp_path / "data" / "parts"
    d.mkdir(parents=True)
    for part, lo in enumerate(range(0, n, 100)):
        ids = range(lo, min(n, lo + 100))
        table = pa.table({"id": [f"q{i}" for i in ids], "question": [f"{i} + {i}" for i in ids],
                          "answer": pa.array([2 * i for i in ids], pa.int64())})  # fmt: skip
        buf = io.BytesIO()
        pq.write_table(table, buf, row_group_size=50)
        (d / f"train-{part:05d}-of-00003.parquet").write_bytes(buf.getvalue())
    return d


@pytest.mark.parametrize("given", ["jsonl", "parquet parts"])
def test_a_parquet_run_reads_as_one_dataset_and_accounts_for_every_id(
    tmp_path: Path, env: dict[str, str], given: str
) -> None:
    src = dataset(tmp_path, 300) if given == "jsonl" else _parquet_parts(tmp_path, 300)
    root = tmp_path / "run"

    def run() -> dict[str, Any]:
        return cli("run", str(src), str(root), "--name", "pq", "--engine", "simulated", "--engine-arg",
                   "approval_rate=0.5", "--prompt-template", "What is {{ question }}?", "--judge",
                   '{"type": "llm"}', "--max-rounds", "3", "--records-per-shard", "100",
                   "--output-format", "parquet", env=env)  # fmt: skip

    try:
        out = run()
        assert out["invariant"]["ok"], out["invariant"]
        rounds = out["rounds"]
        assert [r["round"] for r in rounds] == [0, 1, 2]
        assert rounds[1]["pending"] == rounds[0]["rejected"]  # recompacted from Parquet into round 1
        approved = out["approved"]
        assert 0 < approved < 300 and approved + out["remaining_pending"] == 300

        results = root / "results"
        names = sorted(p.name for p in results.iterdir())
        assert names and all(n.endswith(".parquet") for n in names)
        assert all(p.suffix == ".parquet" for p in (root / "round-00" / "rejected").iterdir())
        assert all(p.name.endswith(".jsonl.zst") for p in (root / "round-01" / "pending").glob("part-*"))

        # one dataset, whichever reads it, holding the input's own text ids once each
        table = ds.dataset(str(results), format="parquet").to_table()
        ids = table.column("id").to_pylist()
        assert len(ids) == len(set(ids)) == approved and set(ids) <= {f"q{i}" for i in range(300)}
        assert set(table.column("status").to_pylist()) == {"approved"}
        assert duckdb.sql(f"select count(*) from '{results}/*.parquet'").fetchall() == [(approved,)]
        # the input's fields are columns of their own, typed: selected and summed, no json_extract
        typed = duckdb.sql(f"select id, question, answer + 0 from '{results}/*.parquet'").fetchall()
        assert len(typed) == approved
        assert all(q == f"{int(i[1:])} + {int(i[1:])}" and a == 2 * int(i[1:]) for i, q, a in typed)
        assert table.schema.field("answer").type == pa.int64()
        assert table.column_names[:3] == ["id", "question", "answer"] and table.column_names[-1] == "record"
        frame = pd.read_parquet(results)
        assert len(frame) == approved and sorted(frame["id"]) == sorted(ids)
        first = frame.iloc[0]
        n = int(first["id"][1:])
        assert first["question"] == f"{n} + {n}" and first["answer"] == 2 * n
        # the overflow: the id field (its own type) and a null error (no column takes a null)
        assert json.loads(first["record"]) == {"id": first["id"], "error": None}
        assert json.loads(first["judgment"])["approved"] is True and first["round"] in (0, 1, 2)

        left = pd.read_parquet(root / "pending")  # the rows left pending, in Parquet beside the results
        assert len(left) == out["remaining_pending"] and sorted([*left["id"], *ids]) == sorted(
            f"q{i}" for i in range(300)
        )

        report = json.loads((root / "report" / "summary.json").read_text())
        assert report["approved"] == approved and report["invariant"]["ok"]
        assert (
            "every input id accounted for exactly once: True" in (root / "report" / "report.md").read_text()
        )

        before = {
            p.name: p.stat().st_mtime_ns for p in (root / "round-00" / "jobs").glob("*.infer_judge.json")
        }
        again = run()  # resume: every job finished, nothing runs again
        assert again["approved"] == approved and again["invariant"]["ok"]
        after = {
            p.name: p.stat().st_mtime_ns for p in (root / "round-00" / "jobs").glob("*.infer_judge.json")
        }
        assert after == before and len(before) == 3
    finally:
        cli("pool", "down", "--name", "pq", env=env)
