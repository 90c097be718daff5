"""Issue 14, item 8: the review gate's body (markdown on the Required Actions page) shows model output
as text. Rendered here with a CommonMark renderer plus tables, as the UI's markdown renderer does."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_batchinfer.run.gate.body import review_body
from airflow_batchinfer.run.plan import Proposal
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import Plan
from airflow_batchinfer.storage import JsonlFile

pytestmark = pytest.mark.security

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
    cfg = RunConfig.of(input="x", run_root=root, prompt_template=None, judge={"type": "llm"})
    shards = [{"shard_id": "part-00000", "uri": str(shard), "records": len(rows)}]
    proposal = Proposal(Plan(slot="round-01", round=1, mode="rounds", shards=shards), options=["Continue"])
    body = review_body(cfg, proposal)
    html = markdown_it.MarkdownIt("commonmark").enable("table").render(body)
    assert "<img" not in html and "![p](evil.png)" in html
    html = html.split("Rejected samples", 1)[1].split("</table>")[0]  # the samples (the rest has markup)
    # GitHub-flavoured markdown would link bare URLs (its autolinks): a word joiner keeps them text
    assert "http://evil" not in html and "http://\u2060evil.example" in html
    html = html.replace("\u2060", "")  # invisible: what the reviewer reads
    for tag in ("<script", "<img", "<a ", "<strong>loud", "<code>", "<b>"):
        assert tag not in html, (tag, html)
    # what the model wrote is there, literally (as HTML text)
    assert "&lt;script&gt;alert('x')&lt;/script&gt;" in html
    assert "![pixel](http://evil.example/track.png?id=1)" in html
    assert "**loud** | a cell break | `code` &amp;lt;b&amp;gt;" in html


def test_the_desk_link_is_ours_and_cannot_be_broken_out_of(tmp_path: Path) -> None:
    """The body links to this gate on the review desk; the DAG and run ids in it are percent-encoded,
    so one holding markdown (a run id is the user's choice) stays inside the link target."""
    from airflow_batchinfer.run.gate.body import desk_url

    url = desk_url("http://127.0.0.1:8080/", "dag_x", "manual__x) ![p](http://evil.example/p.png")
    assert url == ("http://127.0.0.1:8080/dags/dag_x/runs/manual__x%29%20%21%5Bp%5D%28http%3A%2F%2Fevil.example"
                   "%2Fp.png/plugin/review-desk")  # fmt: skip
    cfg = RunConfig.of(input="x", run_root=str(tmp_path / "run"), prompt_template=None, judge={"type": "llm"})
    proposal = Proposal(
        Plan(slot="round-01", round=1, mode="skip", stop="nothing pending"), options=["Continue"]
    )
    html = markdown_it.MarkdownIt("commonmark").enable("table").render(review_body(cfg, proposal, desk=url))
    assert html.count("<a ") == 1 and f'<a href="{url}">' in html and "<img" not in html
