"""The LLM judge: a prompted model decides, and its verdict is parsed robustly.

Accepted verdicts: a JSON object ``{"approved": bool, "reason": str, "score": float}`` (anywhere in
the output, fenced or not), or, when the output holds no JSON at all, exactly one of the words
APPROVED / REJECTED. Anything else — unparsable, truncated, both words, a ``score`` that is not a
finite number in [0, 1] (JSON ``Infinity``/``NaN``, 7) — is a rejection with reason
``invalid_judgment``, never a crash: every engine's verdict is held to :data:`VERDICT_SCHEMA`'s range,
not only the engines that enforce the schema (a jury's ``mean_score`` averages these scores).

On an engine that honours structured outputs (vLLM, and the openai engine, which passes them on) the
judge asks for its verdict as :data:`VERDICT_SCHEMA`, so the model can only write a verdict (unless its
``sampling`` asks for a constraint of its own): :func:`asks_verdict_schema` decides, from the engine
the job's worker runs (``parse_params(engine=)`` into ``build_judge``). The answer is parsed the same way.

``score: logprob`` scores a verdict by the model's own probabilities instead of the number it wrote:
the judge asks for each token's log probability with its 20 likeliest alternatives, finds the token
of the verdict (the value of ``"approved"`` in the object it reads, or the word APPROVED/REJECTED)
and takes P(approve) = p(approve tokens) / (p(approve tokens) + p(reject tokens)) among that
position's alternatives (:func:`approval_probability`). The score is the model's confidence in the
verdict it gave (P(approve) of an approval, 1 - P(approve) of a rejection), as ``review_below_score``
reads a score, and so ``select: best_score`` ranks approvals by P(approve); an engine without
logprobs (the simulated one) refuses it when the judge is built.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from airflow_batchinfer.engines.base import GenerationRequest, SamplingParams, TokenLogprob
from airflow_batchinfer.engines.sampling import FIELDS, MAX_TOP_LOGPROBS
from airflow_batchinfer.engines.scoring import ScoringModel
from airflow_batchinfer.engines.tools import calls_json
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges.base import Generate, Judge, JudgeItem, Scorer, Verdict
from airflow_batchinfer.judges.candidates import GENERATION_FIELDS
from airflow_batchinfer.judges.reasoning import REASONING, REASONING_TEMPLATE, check_template, reasoning_of
from airflow_batchinfer.prompts.build import PromptBuilder, PromptError
from airflow_batchinfer.values import number

INVALID = "invalid_judgment"
INLINE_ITEMS = 4  # up to this many judge prompts render inline when quick (else all in a thread)
_WORDS = re.compile(r"\b(APPROVED|REJECTED)\b", re.IGNORECASE)

DEFAULT_TEMPLATE = (
    "You are a strict reviewer. Decide whether the answer correctly and fully responds to the request.\n\n"
    "Request:\n{{ record.get('prompt') or record.get('question') or record }}\n\nAnswer:\n{{ result }}\n\n"
    'Reply with JSON only: {"approved": true or false, "reason": "<one sentence>", "score": <0..1>}'
)


def with_tool_calls(template: str) -> str:
    """A default template (:data:`DEFAULT_TEMPLATE`, the reasoning one) for an answer that calls
    tools: the calls after the answer's text (OpenAI's list; they were not executed). A template of
    one's own renders ``tool_calls`` where it wants them."""
    return template.replace(
        "{{ result }}\n\n",
        "{{ result }}\n\nTool calls the answer makes (parsed, not executed):\n{{ tool_calls | tojson }}\n\n",
    )


#: The verdict an llm judge asks for on engines that honour structured outputs.
VERDICT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "approved": {"type": "boolean"},
        "reason": {"type": "string"},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["approved", "reason", "score"],
    "additionalProperties": False,
}


def asks_verdict_schema(
    engine: str | None, sampling: Mapping[str, Any] | SamplingParams | None = None, wanted: bool = True
) -> bool:
    """Whether an llm judge on ``engine`` (``None``: not known) asks for :data:`VERDICT_SCHEMA`: it is
    ``wanted`` (the judge spec's ``verdict_schema``, default true), the engine honours structured
    outputs and the judge's ``sampling`` asks for no constraint itself. The one place that decides:
    the judge and the job fingerprint (``rpc.fingerprint``) ask it."""
    if not wanted or engine is None or not FIELDS["structured_outputs"].honoured_by(engine):
        return False
    if isinstance(sampling, SamplingParams):
        return sampling.structured_outputs is None
    sampling = sampling or {}
    return sampling.get("structured_outputs") is None and sampling.get("response_format") in (
        None,
        {"type": "text"},
    )


def schema_verdicts(spec: Any, engine: str | None) -> bool:
    """Whether some llm judge of the judge spec ``spec`` (``all``/``any`` included) asks ``engine``
    for :data:`VERDICT_SCHEMA` (what a job's fingerprint adds: the answers differ)."""
    if not isinstance(spec, Mapping):
        return False
    if spec.get("type") == "llm":
        sampling = spec.get("sampling")
        return asks_verdict_schema(
            engine,
            sampling if isinstance(sampling, Mapping) else None,
            spec.get("verdict_schema") is not False,
        )
    judges = spec.get("judges")
    return isinstance(judges, list) and any(schema_verdicts(j, engine) for j in judges)


MAX_VERDICT_CHARS = 16_384  # a verdict is short: what a longer output holds past this is not read
MAX_OBJECT_STARTS = 64  # each start is a decode attempt: a text of nested braces would be quadratic


def _json_objects(text: str) -> list[tuple[int, dict[str, Any]]]:
    """The JSON objects, with where each starts, that can be decoded starting at one of the first
    ``{`` in ``text`` (bounded: judge output is model output, and this runs on the worker's event
    loop)."""
    decoder = json.JSONDecoder()
    found = []
    text = text[:MAX_VERDICT_CHARS]
    for match in itertools.islice(re.finditer(r"\{", text), MAX_OBJECT_STARTS):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except (ValueError, RecursionError):  # broken, or nested deeper than the decoder goes
            continue
        if isinstance(value, dict):
            found.append((match.start(), value))
    return found


def _score(value: Any) -> tuple[bool, float | None]:
    """A verdict's ``score``: valid (absent, ``null``, or a finite number in [0, 1]) and its value."""
    if value is None:
        return True, None
    score = number(value)
    return score is not None and math.isfinite(score) and 0 <= score <= 1, score


def parse_verdict(text: str | None) -> Verdict:
    if not text or not text.strip():
        return Verdict(False, f"{INVALID}: empty output")
    for _, obj in _json_objects(text):
        approved = obj.get("approved")
        if isinstance(approved, bool):
            valid, score = _score(obj.get("score"))
            if not valid:
                return Verdict(
                    False, f"{INVALID}: score {str(obj.get('score'))[:50]!r} is not a number in [0, 1]"
                )
            return Verdict(approved, str(obj.get("reason", ""))[:2000], score)
    if "{" in text:  # JSON was attempted but is broken or truncated: don't guess from words
        return Verdict(False, f"{INVALID}: no complete JSON verdict in {text[:200]!r}")
    words = {w.upper() for w in _WORDS.findall(text)}
    if len(words) == 1:
        word = words.pop()
        return Verdict(word == "APPROVED", text.strip()[:2000])
    return Verdict(False, f"{INVALID}: {text.strip()[:200]!r}")


_NOT_PROMPTED = GENERATION_FIELDS | {"body", "result"}
SCORES = ("verdict", "logprob")  # the score a verdict carries: the one the model wrote, or P(approve)
_JSON_VERDICT = re.compile(r'"approved"\s*:\s*(true|false)')
_SIDES = {"json": ("true", "false"), "word": ("approved", "rejected")}


def _side(token: str, words: tuple[str, str]) -> int | None:
    """0 when ``token`` begins the approving word, 1 the rejecting one, ``None``: neither."""
    word = token.strip().strip('"').lower()
    if not word:
        return None
    return next((i for i, w in enumerate(words) if w.startswith(word)), None)


def approval_probability(tokens: Sequence[TokenLogprob]) -> float | None:
    """P(approve) at the verdict's token of an answer generated as ``tokens``: the probability mass
    of the alternatives that begin the approving value (``true``, APPROVED) over that of both values;
    ``None`` when the answer holds no verdict. The verdict (the value of ``"approved"`` in the object
    :func:`parse_verdict` reads, else its word) is looked for in the tokens' own text, so its
    position is a token's whatever the tokenizer's decoding made of spaces."""
    text = "".join(t.token for t in tokens)
    verdict = next((start for start, obj in _json_objects(text) if isinstance(obj.get("approved"), bool)), 0)
    if match := _JSON_VERDICT.search(text, verdict):
        at, words = match.start(1), _SIDES["json"]
    elif word := _WORDS.search(text):
        at, words = word.start(), _SIDES["word"]
    else:
        return None
    offset = 0
    for t in tokens:
        offset += len(t.token)
        if offset > at:  # the token holding the verdict's first character
            mass = [0.0, 0.0]
            for token, logprob in t.top or ((t.token, t.logprob),):
                side = _side(token, words)
                if side is not None:
                    mass[side] += math.exp(logprob)
            total = mass[0] + mass[1]
            return None if total == 0 else round(mass[0] / total, 4)
    return None


def prompt_record(item: JudgeItem, *, sees_reasoning: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """What a judge's template renders of ``item``: the record (not its generation: another
    candidate's answer or logprobs are not this one's, and a reasoning model's reasoning is not the
    answer), and ``PromptBuilder.build``'s arguments, ``result`` the answer judged and ``tool_calls``
    the calls it makes (OpenAI's list; ``None``: none); with ``sees_reasoning``, ``reasoning`` its
    reasoning too (:mod:`~airflow_batchinfer.judges.reasoning`)."""
    record = {k: v for k, v in item.record.items() if k not in _NOT_PROMPTED}
    variables: dict[str, Any] = {"result": item.result, "tool_calls": calls_json(item.tool_calls)}
    if sees_reasoning:
        variables[REASONING] = reasoning_of(item)
    kwargs = {
        "request_id": item.record_id,
        "attempt": item.attempt,
        "role": "judge",
        "variables": variables,
        "candidate": item.candidate,
    }
    return record, kwargs


class LLMJudge(Judge):
    """Asks a model (the worker's engine, through its shared batcher) for a verdict per record.

    :param template: Jinja2 over the record's fields, ``record`` and ``result`` (the output judged).
    :param engine: the engine that answers (``None``: not known): where it honours structured outputs
        the verdict is asked for as :data:`VERDICT_SCHEMA` (:func:`asks_verdict_schema`).
    :param verdict_schema: ``False``: never ask for it (free text, parsed as on other engines).
    :param score: ``verdict`` (the score the model wrote) or ``logprob`` (P(approve) from the
        verdict token's log probabilities: :func:`approval_probability`).
    :param sees_reasoning: the template also renders the answer's ``reasoning`` (it must read it).
    """

    kind = "llm"

    def __init__(
        self,
        template: str = DEFAULT_TEMPLATE,
        *,
        system: str | None = None,
        sampling: SamplingParams | None = None,
        engine: str | None = None,
        verdict_schema: bool = True,
        score: str = "verdict",
        sees_reasoning: bool = False,
    ) -> None:
        if sees_reasoning:
            check_template(template)
        if score not in SCORES:
            raise ConfigError(f"llm judge: score {score!r}: choose one of {', '.join(SCORES)}")
        if score == "logprob" and engine is not None and not FIELDS["logprobs"].honoured_by(engine):
            engines = ", ".join(FIELDS["logprobs"].engines)
            raise ConfigError(
                f"llm judge: score logprob reads the verdict token's log probabilities, which the {engine} "
                f"engine does not give: judge on a pool whose engine does ({engines}), or remove score"
            )
        sampling = sampling or SamplingParams(max_tokens=128, temperature=0.0)
        self.verdict_schema = asks_verdict_schema(engine, sampling, verdict_schema)
        if self.verdict_schema:
            sampling = SamplingParams.from_mapping({"structured_outputs": {"json": VERDICT_SCHEMA}}, sampling)
        self.score = score
        if score == "logprob":
            sampling = replace(sampling, logprobs=True, top_logprobs=MAX_TOP_LOGPROBS)
        self.sampling = sampling
        self.prompts = PromptBuilder(template, system=system, sampling=self.sampling, engine=engine)
        self.template, self.system, self.sees_reasoning = template, system, sees_reasoning
        # the default templates show an answer's calls (rows without calls render as they always did)
        self._tool_prompts = (
            PromptBuilder(with_tool_calls(template), system=system, sampling=self.sampling, engine=engine)
            if template in (DEFAULT_TEMPLATE, REASONING_TEMPLATE)
            else self.prompts
        )

    def _builder(self, item: JudgeItem) -> PromptBuilder:
        return self._tool_prompts if item.tool_calls else self.prompts

    async def judge(
        self, items: Sequence[JudgeItem], generate: Generate | None = None, scorer: Scorer | None = None
    ) -> list[Verdict]:
        if generate is None:
            raise ConfigError("the llm judge needs an engine: run it on a worker")
        verdicts: list[Verdict | None] = [None] * len(items)
        # Rendering is bounded per record (prompts.py) but CPU work: a batch renders in a thread; a
        # few items (in-place retries judge one at a time) inline when quick, else in a thread too.
        if len(items) > INLINE_ITEMS:
            requests, positions = await asyncio.to_thread(self._build_all, items, verdicts)
        else:
            requests, positions = [], []
            for i, item in enumerate(items):
                try:
                    record, kwargs = prompt_record(item, sees_reasoning=self.sees_reasoning)
                    requests.append(await self._builder(item).abuild(record, **kwargs))
                except PromptError as exc:
                    verdicts[i] = Verdict(False, f"judge_error: {exc}")
                    continue
                positions.append(i)
        if requests:
            results = await generate(requests)
            for i, result in zip(positions, results, strict=True):
                if not result.ok:
                    verdicts[i] = Verdict(False, f"judge_error: {result.error}")
                    continue
                verdict = parse_verdict(result.text)
                if self.score == "logprob" and not verdict.reason.startswith(INVALID):
                    p = approval_probability(result.logprobs or ())
                    # the model's confidence in the verdict it gave (None: people decide, with
                    # review_below_score); of an approval, P(approve)
                    confidence = None if p is None else (p if verdict.approved else round(1 - p, 4))
                    verdict = replace(verdict, score=confidence)
                verdicts[i] = verdict
        return [v if v is not None else Verdict(False, INVALID) for v in verdicts]

    def serving_refusal(self, scoring: ScoringModel | None) -> str | None:
        if scoring is None:
            return None
        return (
            f"an llm judge asks a generating model for its verdict, and this worker's model "
            f"({os.path.basename(scoring.path)}) is a scoring model: judge with a reward or classifier judge "
            "here, or run the llm judge on a pool whose model generates (in a jury with a model judge, "
            "llm members are judged where the answers are generated)"
        )

    def _build_all(
        self, items: Sequence[JudgeItem], verdicts: list[Verdict | None]
    ) -> tuple[list[GenerationRequest], list[int]]:
        """The judge prompts of ``items``; a record whose prompt fails gets its rejection in
        ``verdicts`` instead."""
        requests, positions = [], []
        for i, item in enumerate(items):
            record, kwargs = prompt_record(item, sees_reasoning=self.sees_reasoning)
            try:
                request = self._builder(item).build(record, **kwargs)
            except PromptError as exc:
                verdicts[i] = Verdict(False, f"judge_error: {exc}")
                continue
            requests.append(request)
            positions.append(i)
        return requests, positions

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "type": self.kind,
            "template": self.template,
            "system": self.system,
            "sampling": self.sampling.as_dict(),
        }
        if self.verdict_schema:  # asked for as VERDICT_SCHEMA (in sampling.structured_outputs too);
            described["verdict_schema"] = True  # absent: free text, and the description it always was
        if self.score != "verdict":
            described["score"] = self.score
        if self.sees_reasoning:  # absent: the answer only, and the description it always was
            described["sees_reasoning"] = True
        return described
