"""The checks of a run's settings that look at several of them together, which ``RunConfig`` (or, for
one section's, the section) runs as it is made (a bad one refused, naming it and its remedy)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_batchinfer.engines.pooling import GENERATE
from airflow_batchinfer.engines.sampling import completion_tokens
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges import judge_needs
from airflow_batchinfer.state.timeouts import (
    UNREACHABLE_GRACE_MAX_S,
    UNREACHABLE_GRACE_MIN_S,
    UNREACHABLE_GRACE_S,
)
from airflow_batchinfer.storage.lines import MAX_LINE_BYTES, MIN_LINE_BYTES
from airflow_batchinfer.storage.records import MAX_ID_BYTES, MIN_ID_BYTES

if TYPE_CHECKING:
    from airflow_batchinfer.state.config import RunConfig
    from airflow_batchinfer.state.config_sections import DataConfig, ShardingConfig


def check_judge_models(cfg: RunConfig) -> None:
    """The judge's models and its pools: a judge pool serves a judge that asks for a model; a
    model judge (reward, classifier) needs one, in rounds; llm and model judges together only
    as members of a jury (judges.jury says where each runs)."""
    judge, judge_pool = cfg.judging.judge, cfg.judging.judge_pool
    needs, kind = judge_needs(judge), judge.get("type")
    if judge_pool is not None and not needs:
        raise ConfigError(
            f"judge_pool {judge_pool!r} serves a judge model, but the judge is {kind!r}, which "
            "needs none: remove judge_pool, or use a judge that asks a model (llm, classifier, reward)"
        )
    if "score" not in needs:
        return
    if judge_pool is None:
        raise ConfigError(
            "a reward or classifier judge scores with a sequence-classification or reward model, which "
            "the judge's own pool serves: give judge_pool (a DAG built with judge_airflow_pool=, its "
            "judge_model the scoring model; batchinfer run --judge-pool local://NAME, a pool started "
            "with `batchinfer pool up --name NAME --model DIR`)"
        )
    if cfg.retries.strategy != "rounds":
        raise ConfigError(
            f"a reward or classifier judge scores on the judge pool, and strategy {cfg.retries.strategy!r} "
            "judges retries in place on the run's pool: use strategy rounds"
        )
    if needs == {"generate", "score"} and kind != "jury":
        raise ConfigError(
            f"the {kind!r} judge asks for both a generating model (llm) and a scoring model (reward, "
            "classifier), which no one pool serves: make them members of a jury, where llm members "
            "are judged on the run's pool as the answers are generated"
        )


def check_task(cfg: RunConfig) -> None:
    """A pooling task (embed, classify, score) runs on a pool whose model generates nothing: its
    judge asks no model there (a judge pool may serve one), retries happen in rounds, and an embed or
    score row, which has no text answer, is kept with the ``accept`` judge."""
    task = cfg.prompt.task
    if task == GENERATE:
        return
    judge, kind = cfg.judging.judge, cfg.judging.judge.get("type")
    if cfg.retries.strategy != "rounds":
        raise ConfigError(
            f"task {task!r} computes each record once and retries an error in the next round: use "
            f"strategy rounds, not {cfg.retries.strategy!r}"
        )
    if task in ("embed", "score") and kind != "accept":
        raise ConfigError(
            f"task {task!r} writes {'vectors' if task == 'embed' else 'raw scores'}, no text a "
            f'{kind!r} judge could read: set judge {{"type": "accept"}} (every row computed is kept, '
            "an error retried)"
        )
    if "generate" in judge_needs(judge) and cfg.judging.judge_pool is None:
        raise ConfigError(
            f"task {task!r}: the run's pool serves a classifier, which cannot answer the {kind!r} judge: "
            'use the judge {"type": "label", "keep_labels": [...]} (or a rule judge over the label in '
            "result), or give the llm judge a judge_pool"
        )


def check_spot_check(cfg: RunConfig, judge_type: Any) -> None:
    """Spot checks need a judge that approves, and rounds (the gate between them)."""
    if not cfg.reviews.spot_check_approved:  # its own bounds: ReviewConfig's
        return
    if judge_type == "human":
        raise ConfigError(
            "spot_check_approved puts some of the judge's approved rows before people, but a human "
            "judge approves none on its own (every row goes to people): remove spot_check_approved"
        )
    if cfg.retries.strategy == "in_place":
        raise ConfigError(
            "spot_check_approved holds back approved rows of a round until its review gate; strategy "
            "'in_place' has no rounds: use strategy 'rounds' or 'hybrid', or remove spot_check_approved"
        )


def check_bounds(cfg: DataConfig) -> None:
    """``max_line_bytes`` and ``max_id_bytes`` at least their settings' minimums."""
    for name, least, default in (
        ("max_line_bytes", MIN_LINE_BYTES, MAX_LINE_BYTES),
        ("max_id_bytes", MIN_ID_BYTES, MAX_ID_BYTES),
    ):
        if getattr(cfg, name) < least:
            raise ConfigError(
                f"{name} must be >= {least:g}, got {getattr(cfg, name)}: raise it (its default is {default})"
            )


def check_retries(cfg: RunConfig) -> None:
    """The retry settings, checked over the run's ``sampling`` (``RunConfig.retry``), and no retry
    asking for more ``max_tokens`` than ``max_tokens_cap`` (which bounds every retry's)."""
    retry = cfg.retry()
    cap = cfg.retries.max_tokens_cap
    for first, fields in retry.sampling if cap is not None else ():
        tokens = completion_tokens(fields)
        if tokens is not None and tokens > cap:
            raise ConfigError(
                f"retry_sampling.{first}.max_tokens {tokens} is above max_tokens_cap {cap} (a DAG run's: "
                "the deployment's max_max_tokens): lower it, or ask for a higher cap"
            )


def check_unreachable_grace(cfg: ShardingConfig) -> None:
    """Below the minimum a worker is taken for gone after one silent ask (0: the protection off);
    above the maximum the grace never elapses within one try (each starts a fresh client)."""
    grace, low, high = cfg.unreachable_grace_s, UNREACHABLE_GRACE_MIN_S, UNREACHABLE_GRACE_MAX_S
    if not low <= grace <= high:
        raise ConfigError(
            f"unreachable_grace_s {grace:g} is outside {low:g}..{high:g} s: set it within (default "
            f"{UNREACHABLE_GRACE_S:g}); a shorter grace would start a second copy of a job a paused "
            "worker still runs, a longer one never elapses within a try, so no try could start the job"
        )
