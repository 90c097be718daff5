"""Issue 22, item 6: the review gate's body (Airflow stores it, the Required Actions page renders it)
stays bounded whatever the run holds: each embedded text is cut (a sample's cells, the controller's
reason and stop) and the whole body to ``MAX_BODY_BYTES``, with a note that says so; the answers'
meaning at its end is always kept."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.run.gate.body import MAX_BODY_BYTES, MAX_BODY_TEXT, review_body
from airflow_batchinfer.run.plan import Proposal
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import Plan
from airflow_batchinfer.storage import JsonlFile

pytestmark = pytest.mark.security

MIB = 1024 * 1024
ENDING = "**Stop**: end the run; the pending set stays reported."


def gate(tmp_path: Path, rows: list[dict[str, Any]], **plan: Any) -> tuple[RunConfig, Proposal]:
    shard = tmp_path / "pending" / "part-00000.jsonl"
    with JsonlFile(str(shard)).writer_sync() as w:
        w.write_many(rows)
    cfg = RunConfig.of(input="x", run_root=str(tmp_path / "run"), prompt_template=None, judge={"type": "llm"})
    shards = [{"shard_id": "part-00000", "uri": str(shard), "records": len(rows)}]
    return cfg, Proposal(
        Plan(slot="round-01", round=1, mode="rounds", shards=shards, **plan), options=["Continue"]
    )


def test_huge_reasons_outputs_and_errors_are_cut_in_the_body(tmp_path: Path) -> None:
    huge = [{"id": f"r{i}", "question": "q" * MIB, "result": "o" * 4 * MIB, "status": "error",
             "error": "e" * MIB, "judgment": {"approved": False, "reason": "r" * 4 * MIB}}
            for i in range(10)]  # fmt: skip
    cfg, proposal = gate(tmp_path, huge, reason="why " * MIB, stop="stopped " * MIB)
    body = review_body(cfg, proposal)
    assert len(body.encode()) < 16 * 1024  # ten samples, each cell 80 characters at most
    (proposes,) = [line for line in body.splitlines() if line.startswith("The controller proposes")]
    assert len(proposes) < 2 * MAX_BODY_TEXT + 100 and proposes.endswith("…).")
    rows = [line for line in body.splitlines() if line.startswith("| r") and "round" not in line]
    assert len(rows) == 10 and all(len(cell.strip()) <= 80 for row in rows for cell in row.split("|"))
    assert "q" * 79 + "…" in rows[0] and "o" * 79 + "…" in rows[0] and "r" * 79 + "…" in rows[0]
    assert body.endswith(ENDING)


def test_the_whole_body_is_cut_with_a_note_and_keeps_its_ending(tmp_path: Path) -> None:
    wide = [{"id": f"r{i:05d}", "question": "<q> " * 40, "result": "[o] " * 40,
             "judgment": {"approved": False, "reason": "*r* " * 40}} for i in range(3_000)]  # fmt: skip
    cfg, proposal = gate(tmp_path, wide)
    body = review_body(cfg, proposal, sample=3_000)
    assert len(body.encode()) <= MAX_BODY_BYTES
    assert "| r00000 |" in body and "| r02999 |" not in body  # the first samples, not all 3,000
    (note,) = [line for line in body.splitlines() if line.startswith("*(truncated:")]
    assert "more lines left out" in note and "review desk" in note
    assert body.endswith(ENDING) and "Full rejected set:" in body


def test_the_note_is_not_a_table_row(tmp_path: Path) -> None:
    markdown_it = pytest.importorskip("markdown_it", reason="comes with the docs tools (myst-parser)")
    rows = [{"id": f"r{i:05d}", "result": "x" * 200} for i in range(3_000)]
    cfg, proposal = gate(tmp_path, rows)
    html = (
        markdown_it.MarkdownIt("commonmark").enable("table").render(review_body(cfg, proposal, sample=3_000))
    )
    table, after = html.split("</table>", 1)
    assert "truncated:" not in table and "<em>(truncated:" in after
