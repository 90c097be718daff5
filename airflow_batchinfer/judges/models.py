"""Model judges: a reward or classifier model scores each answer, and a threshold decides.

``{"type": "classifier", "threshold": 0.5, "label": "POSITIVE"}``: the score is the model's
P(``label``) (softmax over its labels; the sigmoid of a single output or of a multi-label model's
label), in [0, 1]; ``label`` defaults to :func:`~airflow_batchinfer.engines.scoring.default_label`
(the only label, one named like POSITIVE, else the last: ``LABEL_1``).

``{"type": "reward", "threshold": 1.5}``: the score is the model's raw output (of ``label``, default
the first: a reward head has one), on the model's own scale: ``threshold`` is required.

Both approve a score at or above ``threshold``, and keep it in ``judgment.score``. They run on a
worker whose model is a scoring model (a judge pool's: :attr:`Engine.scoring
<airflow_batchinfer.engines.base.Engine.scoring>`); a job is refused at submit on another
(:meth:`ModelJudge.serving_refusal`), or when ``model`` names another model than the worker's.

What is scored: the conversation the answer belongs to, the record's prompt as the run renders it
(its ``prompt_template`` and ``system``; a retry's with ``retry_template`` and ``retry_system`` and the
``previous`` its row carries, as :mod:`~airflow_batchinfer.prompts.retries` decided it for the answer's
generation; or an OpenAI batch request's ``body``) with the answer as the assistant's turn, through
the model's chat template; or, with ``template`` (Jinja2 over the
record's fields, ``record`` and ``result``), exactly that text (e.g. ``"{{ result }}"`` for a
classifier of answers alone).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_batchinfer.engines.scoring import ScoreRequest, ScoringModel, label_probability
from airflow_batchinfer.exceptions import ConfigError, PromptError
from airflow_batchinfer.judges.base import Generate, Judge, JudgeItem, Scorer, Verdict
from airflow_batchinfer.judges.candidates import GENERATION_FIELDS
from airflow_batchinfer.judges.llm import INLINE_ITEMS, prompt_record
from airflow_batchinfer.prompts.build import PromptBuilder, is_openai_batch
from airflow_batchinfer.prompts.retries import PREVIOUS, Previous

MODEL_JUDGES = ("classifier", "reward")
MODEL_JUDGE_KEYS = frozenset({"model", "threshold", "label", "template"})
# A row's fields a conversation is not rendered from: what its generation and verdicts added (other
# candidates, logprobs, a jury's carried verdicts), and the answer, which is the assistant's turn.
_NOT_PROMPTED = GENERATION_FIELDS | {"result"}
# An OpenAI batch request body's fields that are its conversation (the rest: how it was answered).
_CONVERSATION = frozenset({"messages", "prompt"})


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{what} must be a number, got {value!r}")
    return float(value)


class ModelJudge(Judge):
    """A ``classifier`` or ``reward`` judge (see the module).

    :param model: the model directory the scores must come from (``None``: whatever the worker's
        scoring model is): a worker serving another refuses the job.
    :param threshold: a score at or above it approves.
    :param label: the label read (a name or an output index; ``None``: the default).
    :param template: the text scored (Jinja2); ``None``: the conversation.
    """

    def __init__(
        self,
        kind: str,
        *,
        model: str | None = None,
        threshold: float | None = None,
        label: str | int | None = None,
        template: str | None = None,
    ) -> None:
        if kind not in MODEL_JUDGES:
            raise ConfigError(f"a model judge is one of {', '.join(MODEL_JUDGES)}, got {kind!r}")
        self.kind = kind  # type: ignore[misc]
        if model is not None and (not isinstance(model, str) or not model):
            raise ConfigError(
                f"{kind} judge: model must be the model's directory on the workers, got {model!r}"
            )
        if threshold is None:
            if kind == "reward":
                raise ConfigError(
                    "reward judge: give a threshold on the reward model's own scale (a reward at or above "
                    'it approves), e.g. {"type": "reward", "threshold": 0.0}'
                )
            threshold = 0.5
        self.threshold = _number(threshold, f"{kind} judge: threshold")
        if kind == "classifier" and not 0 <= self.threshold <= 1:
            raise ConfigError(
                f"classifier judge: threshold {self.threshold:g} is a probability: give one in [0, 1]"
            )
        if label is not None and (isinstance(label, bool) or not isinstance(label, str | int)):
            raise ConfigError(f"{kind} judge: label must be a label's name or index, got {label!r}")
        if template is not None and not isinstance(template, str):
            raise ConfigError(f"{kind} judge: template must be a string (a Jinja2 template)")
        self.model, self.label, self.template = model, label, template
        self.texts = None if template is None else PromptBuilder(template, chat=False)

    def serving_refusal(self, scoring: ScoringModel | None) -> str | None:
        if scoring is None:
            return (
                f"a {self.kind} judge scores with a sequence-classification or reward model, and this "
                "worker's model generates: judge on a pool whose model is one (a run's judge_pool with "
                "judge_model, or `batchinfer pool up --model` for --judge-pool)"
            )
        if self.model is not None and os.path.realpath(self.model) != scoring.path:
            return (
                f"the {self.kind} judge names the model {self.model}, and this worker serves "
                f"{scoring.path}: start the judge pool with that model, or change the judge's model"
            )
        try:
            scoring.label_index(self.label)
        except ConfigError as exc:
            return f"{self.kind} judge: {exc}"
        return None

    async def judge(
        self, items: Sequence[JudgeItem], generate: Generate | None = None, scorer: Scorer | None = None
    ) -> list[Verdict]:
        if scorer is None:
            raise ConfigError(
                f"the {self.kind} judge needs a scoring model: run it on a worker that serves one"
            )
        index = scorer.model.label_index(self.label)
        verdicts: list[Verdict | None] = [None] * len(items)
        if len(items) > INLINE_ITEMS:  # rendering is CPU work: a batch's in a thread
            requests, positions = await asyncio.to_thread(self._requests, items, scorer, verdicts)
        else:
            requests, positions = self._requests(items, scorer, verdicts)
        if requests:
            results = await scorer.score(requests)
            for i, res in zip(positions, results, strict=True):
                if res.logits is None or not res.ok:
                    verdicts[i] = Verdict(False, f"judge_error: {res.error}")
                    continue
                verdicts[i] = self._verdict(res.logits, index, scorer.model)
        return [v if v is not None else Verdict(False, "judge_error: not scored") for v in verdicts]

    def _verdict(self, logits: Sequence[float], index: int, model: ScoringModel) -> Verdict:
        if index >= len(logits):
            return Verdict(False, f"judge_error: the model gave {len(logits)} outputs, no label {index}")
        name = model.labels[index] if index < len(model.labels) else str(index)
        if self.kind == "classifier":
            score = round(label_probability(logits, index, multi_label=model.multi_label), 6)
            what = f"P({name}) {score:.4f}"
        else:
            score = round(float(logits[index]), 6)
            what = f"reward {score:.4f}"
        approved = score >= self.threshold
        return Verdict(approved, f"{what} {'>=' if approved else '<'} threshold {self.threshold:g}", score)

    def _requests(
        self, items: Sequence[JudgeItem], scorer: Scorer, verdicts: list[Verdict | None]
    ) -> tuple[list[ScoreRequest], list[int]]:
        """The texts of ``items`` to score; an item whose text cannot be rendered gets its rejection
        in ``verdicts`` instead."""
        requests, positions = [], []
        prompts = scorer.prompts or PromptBuilder(None)  # none: OpenAI batch requests, from their body
        for i, item in enumerate(items):
            try:
                requests.append(self._request(item, scorer.prompts is not None, prompts))
            except PromptError as exc:
                verdicts[i] = Verdict(False, f"judge_error: {exc}")
                continue
            positions.append(i)
        return requests, positions

    def _request(self, item: JudgeItem, templated: bool, prompts: PromptBuilder) -> ScoreRequest:
        """The text scored for ``item``: the judge's ``template``, else the conversation ``prompts``
        renders (``templated``: the run's prompt; else only an OpenAI batch request's body)."""
        meta = {"record_id": item.record_id, "attempt": item.attempt, "role": "judge"}
        if self.texts is not None:
            record, kwargs = prompt_record(item)
            text = self.texts.build(record, **kwargs).prompt
            return ScoreRequest(item.record_id, prompt=text, metadata=meta)
        record = {k: v for k, v in item.record.items() if k not in _NOT_PROMPTED}
        if is_openai_batch(record):  # its conversation: its sampling (n, logprobs…) made the answers
            record["body"] = {k: v for k, v in record["body"].items() if k in _CONVERSATION}
        elif not templated:
            raise PromptError(
                "no prompt to score the answer with: the judge job has no prompt_template (a run passes "
                "its own) and the record is no OpenAI batch request; or give the judge a template"
            )
        # a retry's prompt as the infer job rendered it: the attempt's template and system message
        # (retries.sent_with, in the builder) and the previous attempt it was told of (the row's)
        told = item.record.get(PREVIOUS)
        previous = Previous.from_dict(told) if isinstance(told, Mapping) else None
        asked = prompts.build(record, request_id=item.record_id, attempt=item.attempt, previous=previous)
        if asked.messages is not None:
            turns = [*asked.messages, {"role": "assistant", "content": item.result}]
            return ScoreRequest(item.record_id, messages=turns, metadata=meta)
        return ScoreRequest(item.record_id, prompt=f"{asked.prompt}{item.result}", metadata=meta)

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {"type": self.kind, "threshold": self.threshold}
        for key in ("model", "label", "template"):
            if getattr(self, key) is not None:
                described[key] = getattr(self, key)
        return described


def build_model_judge(kind: str, args: Mapping[str, Any]) -> ModelJudge:
    unknown = set(args) - MODEL_JUDGE_KEYS
    if unknown:
        raise ConfigError(
            f"{kind} judge: unknown keys {sorted(unknown)}; it takes {sorted(MODEL_JUDGE_KEYS)}"
        )
    return ModelJudge(kind, **args)
