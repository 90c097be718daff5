"""Judges: decide approved/rejected per record. :func:`build_judge` builds one from a JSON spec
(:mod:`~airflow_batchinfer.judges.registry`, which lists the spec's forms); the judges themselves
live in :mod:`.base`, :mod:`.rules`, :mod:`.llm`, :mod:`.models`, :mod:`.jury` and :mod:`.human`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_batchinfer.lazy import exports

if TYPE_CHECKING:
    from airflow_batchinfer.judges.base import Judge, JudgeItem, Verdict
    from airflow_batchinfer.judges.human import HumanJudge, judges_in_place, require_judge_in_place
    from airflow_batchinfer.judges.jury import Jury
    from airflow_batchinfer.judges.llm import LLMJudge, parse_verdict
    from airflow_batchinfer.judges.registry import (
        JUDGE_TYPES,
        RAW_SCORES,
        UNIT_SCORES,
        build_judge,
        judge_needs,
        judge_specs,
        judged_early,
    )
    from airflow_batchinfer.judges.rules import CallablePolicy

__all__ = [
    "JUDGE_TYPES",
    "RAW_SCORES",
    "UNIT_SCORES",
    "CallablePolicy",
    "HumanJudge",
    "Judge",
    "JudgeItem",
    "Jury",
    "LLMJudge",
    "Verdict",
    "build_judge",
    "judge_needs",
    "judge_specs",
    "judged_early",
    "judges_in_place",
    "parse_verdict",
    "require_judge_in_place",
]
# Imported on first use: importing one module of the package loads no other.
__getattr__, __dir__ = exports(
    __name__,
    __all__,
    {
        "base": ("Judge", "JudgeItem", "Verdict"),
        "human": ("HumanJudge", "judges_in_place", "require_judge_in_place"),
        "jury": ("Jury",),
        "llm": ("LLMJudge", "parse_verdict"),
        "rules": ("CallablePolicy",),
        "registry": (
            "JUDGE_TYPES",
            "RAW_SCORES",
            "UNIT_SCORES",
            "build_judge",
            "judge_needs",
            "judge_specs",
            "judged_early",
        ),
    },
)
