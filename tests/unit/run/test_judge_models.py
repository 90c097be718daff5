"""A run's judge and its pools: model judges need the judge pool (in rounds), llm and model judges
together only in a jury; what the run's jobs carry for them; the job ids of runs without them as
they were; and the worker's refusal of a job its model cannot serve."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from airflow_batchinfer.engines.scoring import ScoringModel
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.rpc.fingerprint import fingerprint, spec_key
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.params import parse_params
from airflow_batchinfer.worker.app import serving_refusal

CLASSIFIER = {"type": "classifier", "threshold": 0.6}
JURY = {"type": "jury", "judges": [{"type": "llm"}, CLASSIFIER, {"type": "length", "min_chars": 1}]}


def run(judge: dict[str, Any], **settings: Any) -> RunConfig:
    return RunConfig.of(
        input="/d/in.jsonl",
        run_root="/d/run",
        prompt_template="Q {{ q }}",
        judge=judge,
        system="sys",
        **settings,
    )


@pytest.mark.parametrize(
    ("judge", "settings", "error"),
    [
        (CLASSIFIER, {}, "scores with a sequence-classification or reward model, which the judge's own pool"),
        (CLASSIFIER, {"judge_pool": "local://j", "strategy": "in_place"}, "use strategy rounds"),
        (CLASSIFIER, {"judge_pool": "local://j", "strategy": "hybrid"}, "use strategy rounds"),
        (
            {"type": "all", "judges": [{"type": "llm"}, CLASSIFIER]},
            {"judge_pool": "local://j"},
            "make them members of a jury",
        ),
        (
            {"type": "regex", "pattern": "x"},
            {"judge_pool": "local://j"},
            "which needs none: remove judge_pool",
        ),
        (
            {"type": "reward", "threshold": 0},
            {"judge_pool": "local://j", "review_below_score": 0.5},
            r"the 'reward' judge gives no scores in \[0, 1\]",
        ),
        ({"type": "length"}, {"review_below_score": 0.5}, "gives no scores"),
    ],
)
def test_refused_settings_name_the_remedy(
    judge: dict[str, Any], settings: dict[str, Any], error: str
) -> None:
    with pytest.raises(ConfigError, match=error):
        run(judge, **settings)


def test_scored_judges_may_send_low_scores_to_people() -> None:
    for judge in (CLASSIFIER, JURY, {"type": "llm"}):
        pool = {} if judge["type"] == "llm" else {"judge_pool": "local://j"}
        assert run(judge, review_below_score=0.7, **pool).reviews.review_below_score == 0.7


def test_a_model_judges_jobs_carry_the_prompt_and_the_jurys_early_members() -> None:
    cfg = run(CLASSIFIER, judge_pool="local://j").validate()
    assert (
        cfg.judge_params().wire()["prompt_template"] == "Q {{ q }}"
        and cfg.judge_params().wire()["system"] == "sys"
    )
    assert "jury_at_inference" not in cfg.infer_params().wire()  # no llm member: nothing judged at inference
    jury = run(JURY, judge_pool="local://j").validate()
    assert jury.infer_params().wire()["jury_at_inference"] == JURY
    infer = parse_params("infer", jury.infer_params().wire())
    assert infer.early_jury is not None and [m.name for m in infer.early_jury.early] == ["llm"]
    judge = parse_params("judge", jury.judge_params().wire())
    assert judge.conversation is not None and judge.conversation.template == "Q {{ q }}"
    # a retry's prompt: its retry template and system message too, only when set (a retry_sampling
    # alone changes no prompt: the judge job's id and fingerprint as without it)
    assert not {"retry_template", "retry_system"} & set(cfg.judge_params().wire())
    resampled = run(CLASSIFIER, judge_pool="local://j", retry_sampling={"2": {"temperature": 0.9}})
    assert resampled.judge_params().wire() == cfg.judge_params().wire()
    retried = run(CLASSIFIER, judge_pool="local://j", retry_template="Again: {{ q }}", retry_system="s2")
    assert retried.judge_params().wire() == {
        **cfg.judge_params().wire(),
        "retry_template": "Again: {{ q }}",
        "retry_system": "s2",
    }
    conversation = parse_params("judge", retried.validate().judge_params().wire()).conversation
    assert conversation is not None and (conversation.retry.template, conversation.retry.system) == (
        "Again: {{ q }}",
        "s2",
    )
    # a jury of an llm and rules judges all its members in the job, wherever that runs
    plain = run({"type": "jury", "judges": [{"type": "llm"}, {"type": "length"}]}, judge_pool="local://j")
    assert (
        "jury_at_inference" not in plain.infer_params().wire()
        and "prompt_template" not in plain.judge_params().wire()
    )


def test_job_ids_and_fingerprints_of_runs_without_the_new_judges_are_as_before() -> None:
    """Pinned as computed before model judges and juries existed (the same on main then)."""
    pinned = {
        ("llm", True): {"infer": "e85eababdc", "judge": "7040caf14b"},
        ("llm", False): {"infer": "e85eababdc", "judge": "7040caf14b"},
        ("all", False): {"infer": "e85eababdc", "judge": "4e2efa82d8"},
    }
    prints = {
        "infer": "8f0050c27c6f9e9dd53a2d1fb81f348f64e58a3ab962eb443b16a08d4be561dd",
        ("judge", "llm"): "815ef32b9548a05789850f355f62a2e454692a5c7643c10294ccc0b38d0659cc",
        ("judge", "all"): "348fa312d2f2ca80a461d5035ed6ebfd50868dcb48ec7905bce89a80f0b0aa09",
    }
    rules = {"type": "all", "judges": [{"type": "regex", "pattern": "x"}, {"type": "length"}]}
    for (kind, pooled), keys in pinned.items():
        cfg = run({"type": "llm"} if kind == "llm" else rules, judge_pool="local://j" if pooled else None)
        for job, params in (("infer", cfg.infer_params().wire()), ("judge", cfg.judge_params().wire())):
            spec = JobSpec(
                job_id="x", kind=job, input="/d/in.jsonl", outputs={"manifest": "/d/m.json"}, params=params
            )  # type: ignore[arg-type]
            assert spec_key(spec) == keys[job]
            engine = {"engine": "transformers", "model": "m"}
            want = prints["infer"] if job == "infer" else prints[("judge", kind)]
            assert fingerprint(spec, engine, {"size": 1, "mtime": 2}) == want


def test_a_worker_refuses_jobs_its_model_cannot_serve() -> None:
    scoring = SimpleNamespace(scoring=ScoringModel("/models/cls", ("rejected", "approved")), embedding=None)
    generating = SimpleNamespace(scoring=None, embedding=None)
    cfg = run(JURY, judge_pool="local://j")
    infer = parse_params("infer", cfg.infer_params().wire())
    judge = parse_params("judge", cfg.judge_params().wire())
    assert serving_refusal("infer", infer, generating) is None  # type: ignore[arg-type]
    assert serving_refusal("judge", judge, scoring) is None  # type: ignore[arg-type]
    why = serving_refusal("infer", infer, scoring)  # type: ignore[arg-type]
    assert why is not None and "(cls) is a scoring model (labels ['rejected', 'approved'])" in why
    why = serving_refusal("judge", judge, generating)  # type: ignore[arg-type]
    assert why is not None and "jury member classifier: a classifier judge scores" in why
    early_only = parse_params("infer", {"prompt_template": "x", "jury_at_inference": JURY})
    assert early_only.early_jury is not None
    with pytest.raises(ConfigError, match="jury_at_inference must be a jury with a model judge"):
        parse_params("infer", {"prompt_template": "x", "jury_at_inference": {"type": "llm"}})


def test_a_round_refuses_pools_whose_models_cannot_serve_the_run() -> None:
    """What the plan step checks once it knows what each pool runs (their engines' descriptions)."""
    generating = {"engine": "transformers", "model": "tiny-llama", "dtype": "float32"}
    scoring = {**generating, "model": "tiny-classifier", "task": "score", "labels": ["no", "yes"]}
    jury = run(JURY, judge_pool="local://j")
    assert jury.pools_refusal(generating, scoring) is None
    assert jury.pools_refusal(generating, None) is None  # not known (workers starting): the jobs tell
    why = jury.pools_refusal(generating, generating)
    assert why is not None and "the judge pool's model (tiny-llama) generates" in why
    why = jury.pools_refusal(scoring, scoring)
    assert why is not None and "the run's pool serves a scoring model (tiny-classifier)" in why
    llm = run({"type": "llm"}, judge_pool="local://j")
    assert llm.pools_refusal(generating, generating) is None
    why = llm.pools_refusal(generating, scoring)
    assert why is not None and "the 'llm' judge asks a generating one" in why
    assert run({"type": "llm"}).pools_refusal(generating) is None
