"""Issue 14, item 8: the review gate's body (markdown on the Required Actions page) shows model output
as text. Rendered here with a CommonMark renderer plus tables, as the UI's markdown renderer does."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_batchinfer.report import review_body
from airflow_batchinfer.rounds import Plan, Proposal
from airflow_batchinfer.run_config import RunConfig
from airflow_batchinfer.storage import JsonlFile

markdown_it = pytest.importorskip("markdown_it", reason="comes with the docs tools (myst-parser)")

OUTPUTS = [
    "<script>alert('x')</script>",
    "![pixel](http://evil.example/track.png?id=1)",
    "[click me](http://evil.example/login) and <img src=x onerror=alert(1)>",
    "**loud** | a cell break | `code` &lt;b&gt;",
]


def test_model_output_in_the_review_body_is_text(tmp_path: Path) -> None:
    shard = tmp_path / "pending" / "part-00000.jsonl"
    rows = [{"id": f"r{i}", "question": "q <b>bold</b>", "result": out, "status": "rejected",
             "judgment": {"approved": False, "reason": f"![r](http://evil.example/{i}.png)"}}
            for i, out in enumerate(OUTPUTS)]  # fmt: skip
    with JsonlFile(str(shard)).writer_sync() as w:
        w.write_many(rows)
    # a run name can carry markup too (it passes the prefix check): the run root is escaped as well
    root = str(tmp_path / "run`![p](evil.png)`")
    cfg = RunConfig(input="x", run_root=root, prompt_template=None, judge={"type": "llm"})
    shards = [{"shard_id": "part-00000", "uri": str(shard), "records": len(rows)}]
    proposal = Proposal(Plan("round-01", 1, "rounds", shards=shards), options=["Continue"], last={})
    body = review_body(cfg, proposal)
    html = markdown_it.MarkdownIt("commonmark").enable("table").render(body)
    assert "<img" not in html and "![p](evil.png)" in html
    html = html.split("Rejected samples", 1)[1].split("</table>")[0]  # the samples (the rest has markup)
    for tag in ("<script", "<img", "<a ", "<strong>loud", "<code>", "<b>"):
        assert tag not in html, (tag, html)
    # what the model wrote is there, literally (as HTML text)
    assert "&lt;script&gt;alert('x')&lt;/script&gt;" in html
    assert "![pixel](http://evil.example/track.png?id=1)" in html
    assert "**loud** | a cell break | `code` &amp;lt;b&amp;gt;" in html
