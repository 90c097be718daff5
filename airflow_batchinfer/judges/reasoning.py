"""What judges see of a reasoning model's answer: the answer only, unless the judge's spec asks.

A row's ``result`` is the answer (a reasoning model's reasoning is the row's ``reasoning``, never
mixed in), and judges judge ``result``. Two settings let a judge look at the reasoning too:

- an ``llm`` judge's ``"sees_reasoning": true`` renders the reasoning into its prompt as the template
  variable ``reasoning`` (the default template then shows it between clear delimiters, and a template
  of one's own must read it); without it the variable is not there at all.
- a rule judge's ``"of": "reasoning"`` (``regex``, ``json_schema``, ``length``, ``expected_answer``,
  ``callable``) checks the reasoning instead of the answer, its reasons prefixed ``reasoning:``; a row
  without reasoning is rejected saying so. Combine it with a judge of the answer under ``all``.

A candidate (sampling ``n`` > 1) is judged with its own reasoning.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from airflow_batchinfer.engines.scoring import ScoringModel
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges import candidates
from airflow_batchinfer.judges.base import Generate, Judge, JudgeItem, Scorer, Verdict
from airflow_batchinfer.prompts.templates import variables_read

__all__ = [
    "OF",
    "REASONING",
    "REASONING_TEMPLATE",
    "OfReasoning",
    "check_of",
    "check_template",
    "reasoning_of",
]

REASONING = "reasoning"  # the row field, and the judge template's variable
OF = ("answer", REASONING)  # what a rule judge checks (its spec's "of")
NO_REASONING = (
    f"{REASONING}: none to check (the engine parsed no reasoning for this answer: a pool without a "
    "reasoning parser, or a model that did not think)"
)

#: The llm judge's default template with the reasoning shown, delimited, before the answer.
REASONING_TEMPLATE = (
    "You are a strict reviewer. Decide whether the answer correctly and fully responds to the request.\n\n"
    "Request:\n{{ record.get('prompt') or record.get('question') or record }}\n\n"
    "The model's reasoning before its answer (evidence only: judge the answer), between the markers:\n"
    "<<<REASONING\n{{ reasoning if reasoning is not none else '(none)' }}\nREASONING>>>\n\n"
    "Answer:\n{{ result }}\n\n"
    'Reply with JSON only: {"approved": true or false, "reason": "<one sentence>", "score": <0..1>}'
)


def reasoning_of(item: JudgeItem) -> str | None:
    """The reasoning of the answer ``item`` judges: its candidate's when the row has candidates,
    else the row's (``None``: none was parsed)."""
    found = candidates.of(item.record)
    source: Mapping[str, Any] = item.record
    if found and item.candidate < len(found):
        source = found[item.candidate]
    value = source.get(REASONING)
    return value if isinstance(value, str) else None


def check_template(template: str) -> None:
    """Refuse an llm judge's own template that asks to see the reasoning and never shows it."""
    if REASONING not in variables_read(template):
        raise ConfigError(
            "llm judge: sees_reasoning is true but its template never reads {{ reasoning }}: place it in "
            "the template (between clear delimiters), or leave template out for the default, which shows it"
        )


def check_of(kind: str, of: Any) -> bool:
    """Whether a rule judge's spec asks it to check the reasoning (its ``of``); ConfigError otherwise."""
    if of not in OF:
        raise ConfigError(f"{kind} judge: of {of!r}: choose one of {', '.join(OF)} (what it checks)")
    return bool(of == REASONING)


class OfReasoning(Judge):
    """A rule judge run over each answer's reasoning instead of the answer (``"of": "reasoning"``)."""

    def __init__(self, inner: Judge) -> None:
        self.inner = inner

    async def judge(
        self, items: Sequence[JudgeItem], generate: Generate | None = None, scorer: Scorer | None = None
    ) -> list[Verdict]:
        verdicts: list[Verdict] = [Verdict(False, NO_REASONING)] * len(items)
        texts = [(i, text) for i, item in enumerate(items) if (text := reasoning_of(item)) is not None]
        if texts:
            judged = await self.inner.judge([replace(items[i], result=t) for i, t in texts], generate, scorer)
            for (i, _), v in zip(texts, judged, strict=True):
                verdicts[i] = replace(v, reason=f"{REASONING}: {v.reason}")
        return verdicts

    def serving_refusal(self, scoring: ScoringModel | None) -> str | None:
        return self.inner.serving_refusal(scoring)

    def describe(self) -> dict[str, Any]:
        return {**self.inner.describe(), "of": REASONING}
