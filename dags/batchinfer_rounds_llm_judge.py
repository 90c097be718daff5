"""Rounds with an LLM judge: generate, let the model judge each answer against the question, and
re-run the rejected set in the next round, up to max_rounds."""

from __future__ import annotations

from airflow_batchinfer.dag_factory import build_batch_inference_dag, embedded_defaults

JUDGE = {
    "type": "llm",
    "template": (
        "Question: {{ record.question }}\nProposed answer: {{ result }}\nThe correct answer is "
        "{{ record.answer }}. Is the proposed answer correct? Reply with JSON: "
        '{"approved": true or false, "reason": "..."}'
    ),
    "sampling": {"max_tokens": 48, "temperature": 0.0},
}

dag = build_batch_inference_dag(
    "batchinfer_rounds_llm_judge",
    max_rounds=3,
    airflow_pool="batchinfer",
    defaults={**embedded_defaults(), "strategy": "rounds", "judge": JUDGE},
    doc_md=__doc__,
)
