"""The trigger form in sections (issue 36, item 4): each DAG param carries its setting's section
(Airflow's ``Param(section=...)``), the params come in the sections' order, the operational knobs are
in Advanced, and the docs table names each param's section."""

from __future__ import annotations

import importlib.util

import pytest

from airflow_batchinfer.spec.settings import ADVANCED, BY_NAME, RUN_SETTINGS_SPEC, SECTIONS, reference_table

needs_airflow = pytest.mark.skipif(importlib.util.find_spec("airflow") is None, reason="needs airflow")

# what a person triggering a run chooses: every other param is in the collapsed Advanced section
CHOSEN = {
    "Data": ["input", "output_root", "run_name"],
    "Model & pool": ["engine", "model", "worker_pool"],
    "Prompt & sampling": ["prompt_template", "sampling"],
    "Judge": ["judge", "judge_pool", "judge_model"],
    "Retries": ["strategy", "max_rounds"],
    "Review": ["review"],
    "Budget & failure": ["budget_gpu_hours", "max_failed_shards"],
}
KNOBS = ("records_per_shard", "lanes", "chunk_size", "unreachable_grace_s", "max_id_bytes",
         "max_line_bytes", "id_field", "idle_ttl_s", "target_batch_tokens", "preflight_records")  # fmt: skip


def test_each_section_but_advanced_holds_only_what_a_trigger_chooses() -> None:
    assert SECTIONS[-1] == ADVANCED and list(CHOSEN) == list(SECTIONS[:-1])
    shown = {s: [x.name for x in RUN_SETTINGS_SPEC if x.param and x.section == s] for s in SECTIONS}
    assert {s: names for s, names in shown.items() if s != ADVANCED} == CHOSEN
    outside = [n for s in CHOSEN.values() for n in s if not BY_NAME[n].judge_pool_param]
    assert len(outside) <= 14, outside  # the form of a DAG without a judge pool
    assert set(KNOBS) <= set(shown[ADVANCED])


@needs_airflow
@pytest.mark.parametrize("judge_pool", [False, True])
def test_the_params_carry_their_sections_in_the_sections_order(judge_pool: bool) -> None:
    from airflow_batchinfer.dag_factory import build_batch_inference_dag

    dag = build_batch_inference_dag("sections", judge_airflow_pool="judge" if judge_pool else None)
    sections = [dag.params.get_param(name).schema["section"] for name in dag.params]
    assert sections == [BY_NAME[name].section for name in dag.params]
    # one run of params per section, in SECTIONS' order: the form lists its sections as they first come
    assert sections == sorted(sections, key=SECTIONS.index)
    assert list(dict.fromkeys(sections)) == list(SECTIONS)
    params = dag.params.dump()  # the section is no value: the defaults validate as before
    assert params["chunk_size"] == BY_NAME["chunk_size"].default


def test_the_docs_table_names_each_params_section() -> None:
    header, rows = reference_table()
    assert header[1] == "section"
    by_name = {row[0]: row[1] for row in rows}
    assert by_name["``input``"] == "Data" and by_name["``lanes``"] == ADVANCED
    assert by_name["``job_retries``"] == ""  # not a param: no section
