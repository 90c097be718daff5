"""``batchinfer demo``'s message when a review gate opens (``--review ui`` leaves it open for you)."""

from __future__ import annotations

from airflow_batchinfer.demo import DEMO_DAG, gate_message

RUN = "manual__2026-12-01T03:00:29.718061+00:00"
GATE = {
    "subject": "Round 1: review 39 pending records",
    "body": "**Run** /tmp/runs/demo · strategy **rounds**",
    "task_instance": {"task_id": "round_01.plan", "map_index": -1},
}


def test_with_review_ui_it_prints_the_runs_review_desk_and_required_actions_page() -> None:
    text = gate_message("http://127.0.0.1:8080/", DEMO_DAG, RUN, GATE, review="ui")
    run = "manual__2026-12-01T03%3A00%3A29.718061%2B00%3A00"  # "+" would be a space in a pasted URL
    lines = text.splitlines()
    assert "REVIEW GATE (Round 1: review 39 pending records)" in lines and GATE["body"] in lines
    [desk] = [line for line in lines if line.startswith("review the samples on the review desk:")]
    assert desk.split()[-1] == f"http://127.0.0.1:8080/dags/{DEMO_DAG}/runs/{run}/plugin/review-desk"
    [actions] = [line for line in lines if line.startswith("answer it on the Required Actions page:")]
    assert actions.split()[-1] == f"http://127.0.0.1:8080/dags/{DEMO_DAG}/runs/{run}/required_actions"
    assert "temperature" in text  # the gate's form can change the next rounds


def test_with_review_auto_it_prints_the_gate_only() -> None:
    text = gate_message("http://127.0.0.1:8080", DEMO_DAG, RUN, {**GATE, "body": None}, review="auto")
    assert "REVIEW GATE (Round 1: review 39 pending records)" in text
    assert "http" not in text and "None" not in text


def test_the_gate_body_is_printed_as_plain_text() -> None:
    # the UI's markdown keeps values literal (backslashes, word joiners); a terminal shows them plain
    body = "\\/runs\\/demo\\-1 · http\\:\\/\\/\u2060x\\.example\\: 11 \\+ 11\\?"
    text = gate_message("http://127.0.0.1:8080", DEMO_DAG, RUN, {**GATE, "body": body}, review="auto")
    assert "/runs/demo-1 · http://x.example: 11 + 11?" in text.splitlines()
