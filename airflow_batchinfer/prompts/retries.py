"""What each attempt of a sample is sent with: retries that use feedback.

A sample's first attempt renders the run's ``prompt_template`` with its ``system`` message and
``sampling``. Every later attempt (the next round's, or the next one in place) may use what the
last attempt got: the template variable ``previous`` (:class:`Previous`: the last ``result``, the
judge's ``reason`` and ``score``, the ``attempt`` number, the reviewer's ``note`` when a person
sent the sample back, the ``finish_reason`` and ``max_tokens`` it ran with, whether it was
``truncated_in_thinking`` and its ``thinking_token_budget``), ``None`` on a first
attempt (so ``{% if previous %}`` works), and the run's retry settings (:class:`RetrySettings`):
``retry_template`` and ``retry_system`` replace the template and the system message from the second
attempt on, and ``retry_sampling`` (``{"2": {...}, "3": {...}}``) sets sampling fields per attempt
over the run's ``sampling``: attempt *k* takes the entry of the highest attempt number at most *k*.

:func:`sent_with` is the one decision: the template, system message and sampling of attempt *k*,
from the settings and the truncation decision on the attempt before (a truncated attempt's retry
runs with more ``max_tokens``: :mod:`~airflow_batchinfer.judges.truncation`). The prompt builder asks it
for every request, so an infer job's round-N rows and an in-place job's retries are decided alike;
the previous attempt is :func:`previous_of` a row in both (a round's pending row, an in-place
attempt's row, or an in-place checkpoint's copy of it, so a resumed job renders the same prompt).

Only the system's own rows record attempts (:func:`attempts_before`): a round-0 job reads input
records, which are user data whatever fields they carry. A record's own ``finish_reason``,
``attempts``, ``max_tokens`` or ``sent_back`` is never taken for an earlier attempt (it would skip
to the retry template, or lift the token cap); from round 1 on a job reads the rows earlier rounds
wrote, where the job's own fields replaced a record's of those names.

A row whose prompt read ``previous`` carries it (the row field ``previous``): the review desk renders
what the attempt was sent with from it. The next attempt's ``previous`` is made from the row's own
``result`` and ``judgment``, never from that field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_batchinfer.engines.base import SamplingParams
from airflow_batchinfer.engines.budget import THINKING_BUDGET
from airflow_batchinfer.engines.sampling import refusals
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.prompts.templates import variables_read
from airflow_batchinfer.values import number, whole_number

__all__ = [
    "NO_RETRY",
    "PREVIOUS",
    "SENT_BACK",
    "Previous",
    "RetrySettings",
    "Sent",
    "attempt_seed",
    "attempt_template",
    "attempts_before",
    "previous_of",
    "reads_previous",
    "sent_with",
]

PREVIOUS = "previous"  # the template variable, and the row field of a prompt that read it
SENT_BACK = "sent_back"  # a row a reviewer's retry decision names: {by, at, note, round} (review.apply)
# What a retry may not change: the rows' shape and what the judge step reads of them.
NOT_PER_ATTEMPT = {
    "n": "candidates per record are the run's (each attempt's rows and counts have as many)",
    "logprobs": "log probabilities are the run's (every attempt's rows carry them, or none does)",
    "top_logprobs": "log probabilities are the run's (every attempt's rows carry them, or none does)",
}


# the fields of a reasoning attempt, with their defaults (what any other attempt has)
_REASONING: dict[str, Any] = {"truncated_in_thinking": False, THINKING_BUDGET: None}


@dataclass(frozen=True)
class Previous:
    """What a retry knows of the attempt before it: the template's ``previous``.

    :ivar attempt: that attempt's number (this one is ``attempt + 1``).
    :ivar result: its answer (``None``: the engine gave none, an inference error).
    :ivar reason: the judge's reason for rejecting it.
    :ivar score: the judge's score, when it gave one.
    :ivar note: the reviewer's note, when a person sent the sample back (a retry decision with a note).
    :ivar finish_reason: how its generation ended (``length``: cut at ``max_tokens``).
    :ivar max_tokens: what it ran with.
    :ivar truncated_in_thinking: it was cut at ``max_tokens`` while the model was still thinking.
    :ivar thinking_token_budget: the thinking budget it ran with (``None``: none).
    """

    attempt: int
    result: str | None = None
    reason: str | None = None
    score: float | None = None
    note: str | None = None
    finish_reason: str | None = None
    max_tokens: int | None = None
    truncated_in_thinking: bool = False
    thinking_token_budget: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """The template's ``previous``, the row field and the checkpoint's copy (every field, ``None``
        included: ``{{ previous.note }}`` is never undefined)."""
        return dataclasses.asdict(self)

    def stored(self) -> dict[str, Any]:
        """The row field and a checkpoint's copy: :meth:`as_dict` less the reasoning fields at their
        defaults, so an ordinary job's rows keep the shape they had (:meth:`from_dict` reads both)."""
        return {k: v for k, v in self.as_dict().items() if k not in _REASONING or v != _REASONING[k]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Previous:
        """From :meth:`as_dict` (a checkpoint's); unknown keys are left out."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def previous_of(row: Mapping[str, Any]) -> Previous | None:
    """The attempt ``row`` (a row the system wrote: :func:`attempts_before` decides) records, as the
    next attempt's ``previous``; ``None`` for a row without a ``finish_reason`` (every generated row
    carries one). The reviewer's ``note`` is the one of the retry decision that sent the row back
    (``sent_back``, which the next attempt's row no longer carries)."""
    if "finish_reason" not in row:
        return None
    judgment = row.get("judgment")
    judgment = judgment if isinstance(judgment, Mapping) else {}
    sent_back = row.get(SENT_BACK)
    note = sent_back.get("note") if isinstance(sent_back, Mapping) else None
    attempt = whole_number(row.get("attempts"))
    max_tokens = whole_number(row.get("max_tokens"))
    thinking = whole_number(row.get(THINKING_BUDGET))
    result, reason, finish = row.get("result"), judgment.get("reason"), row.get("finish_reason")
    return Previous(
        attempt=attempt if attempt is not None and attempt >= 1 else 1,
        result=None if result is None else str(result),
        reason=None if reason is None else str(reason),
        score=number(judgment.get("score")),
        note=str(note) if note else None,
        finish_reason=None if finish is None else str(finish),
        max_tokens=max_tokens if max_tokens is not None and max_tokens >= 1 else None,
        truncated_in_thinking=row.get("truncated_in_thinking") is True,
        thinking_token_budget=thinking if thinking is not None and thinking >= 0 else None,
    )


def attempts_before(record: Mapping[str, Any], round: int) -> tuple[int, Previous | None]:
    """What a job of round ``round`` reads of ``record``'s earlier attempts: how many there were and
    the last one (:func:`previous_of`). A round-0 job's records are input records: none, whatever
    fields they carry; a later round's are the rows the rounds before wrote."""
    if round < 1:
        return 0, None
    attempts = whole_number(record.get("attempts"))
    return max(attempts or 0, 0), previous_of(record)


# -------------------------------------------------------------------------------------- settings
def _retry_sampling(value: Any, base: SamplingParams) -> tuple[tuple[int, dict[str, Any]], ...]:
    """``retry_sampling`` checked: ``{attempt: sampling fields}``, each attempt a whole number >= 2,
    each entry sampling fields some engine honours (engines.sampling's one description), none of
    :data:`NOT_PER_ATTEMPT`, valid over ``base`` (the job's sampling). Sorted by attempt."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ConfigError(
            f'retry_sampling must be an object {{attempt: sampling fields}}, e.g. {{"2": {{"temperature": '
            f"0.7}}}}, got {value!r}"
        )
    out: dict[int, dict[str, Any]] = {}
    for key, fields in value.items():
        text = str(key)
        attempt = int(text) if text.isascii() and text.isdigit() and not isinstance(key, bool) else None
        if attempt is None or attempt < 2:
            raise ConfigError(
                f"retry_sampling key {key!r}: an attempt number >= 2, the first attempt it applies to "
                "(attempt 1 runs with sampling)"
            )
        if attempt in out:
            raise ConfigError(f"retry_sampling names attempt {attempt} twice")
        if not isinstance(fields, Mapping):
            raise ConfigError(f"retry_sampling.{key} must be an object of sampling fields, got {fields!r}")
        where = f"retry_sampling.{attempt}"
        problems = [
            f"{where}.{name} is refused: {why}: remove it"
            for name, why in NOT_PER_ATTEMPT.items()
            if name in fields  # even the run's own value: a retry's rows are shaped by the run's
        ]
        problems += [f"{where}: {r}" for r in refusals(fields, in_body=False)]
        if problems:
            raise ConfigError("; ".join(problems))
        try:
            SamplingParams.from_mapping(fields, base)
        except ConfigError as exc:
            raise ConfigError(f"{where} over the run's sampling: {exc}") from None
        out[attempt] = dict(fields)
    return tuple(sorted(out.items()))


@dataclass(frozen=True)
class RetrySettings:
    """A run's retry settings (run settings ``retry_template``, ``retry_system``, ``retry_sampling``).

    :ivar template: the prompt template from the second attempt on (``None``: the run's).
    :ivar system: the system message from the second attempt on (``None``: the run's).
    :ivar sampling: ``(attempt, fields)`` pairs, by attempt: attempt *k* runs with the run's sampling
        updated by the fields of the highest attempt at most *k*.
    """

    template: str | None = None
    system: str | None = None
    sampling: tuple[tuple[int, dict[str, Any]], ...] = ()

    @classmethod
    def from_params(cls, params: Mapping[str, Any], base: SamplingParams | None = None) -> RetrySettings:
        """The settings of a job's (or a run's) ``params``; a bad value is a :class:`ConfigError`
        naming it. ``base``: the sampling the entries of ``retry_sampling`` apply over."""
        template, system = params.get("retry_template"), params.get("retry_system")
        for name, value in (("retry_template", template), ("retry_system", system)):
            if value is not None and not (isinstance(value, str) and value):
                raise ConfigError(f"{name} must be text (empty: none), got {value!r}")
        sampling = _retry_sampling(params.get("retry_sampling"), base or SamplingParams())
        return cls(template, system, sampling)

    def __bool__(self) -> bool:
        return bool(self.template or self.system or self.sampling)

    def params(self) -> dict[str, Any]:
        """The job params of these settings: only those set, so a job without them has the id and
        fingerprint of one with no retry settings (``retry_sampling``'s keys as numbers in text)."""
        out: dict[str, Any] = {}
        if self.template is not None:
            out["retry_template"] = self.template
        if self.system is not None:
            out["retry_system"] = self.system
        if self.sampling:
            out["retry_sampling"] = {str(k): dict(v) for k, v in self.sampling}
        return out

    def texts(self) -> RetrySettings:
        """These settings without ``retry_sampling``: what a retry's prompt text depends on (a model
        judge scores the conversation an answer was generated from, whatever it was sampled with)."""
        return RetrySettings(self.template, self.system)

    def entry(self, attempt: int) -> tuple[int, dict[str, Any]] | None:
        """The ``retry_sampling`` entry attempt ``attempt`` runs with, ``(its first attempt, its
        fields)``; ``None``: none."""
        chosen = None
        for first, fields in self.sampling:
            if first <= attempt:
                chosen = (first, fields)
        return chosen


NO_RETRY = RetrySettings()


# -------------------------------------------------------------------------------------- decision
def attempt_seed(sampling: SamplingParams, attempt: int) -> SamplingParams:
    """Each retry of a seeded request samples differently but reproducibly."""
    if sampling.seed is None or attempt <= 1:
        return sampling
    return SamplingParams.from_mapping({"seed": sampling.seed + 1_000_003 * (attempt - 1)}, sampling)


@dataclass(frozen=True)
class Sent:
    """What one attempt is sent with.

    :ivar template: its prompt template (``None``: the record is an OpenAI batch request).
    :ivar system: its system message.
    :ivar sampling: its sampling: the seed its own, ``max_tokens`` at least what truncation leaves it.
    :ivar retry: the retry template (or system message) was chosen.
    """

    template: str | None
    system: str | None
    sampling: SamplingParams
    retry: bool = False


def sent_with(
    retry: RetrySettings,
    *,
    attempt: int,
    template: str | None,
    system: str | None,
    sampling: SamplingParams,
    least_max_tokens: int | None = None,
    least_thinking_tokens: int | None = None,
) -> Sent:
    """What attempt ``attempt`` of a sample is sent with: ``template``, ``system`` and ``sampling``
    (the job's, or an OpenAI batch record's own), with the retry template and system message from
    the second attempt on, the ``retry_sampling`` entry that applies, the attempt's own seed
    (:func:`attempt_seed`) and at least ``least_max_tokens``: the truncation decision on the previous
    attempt (:func:`~airflow_batchinfer.judges.truncation.decide`: a truncated attempt's retry runs
    with more; ``None``: none), and its thinking budget at least ``least_thinking_tokens`` (an attempt
    cut while thinking: raised when this attempt runs with a budget; one without runs without).
    Pure; :class:`ConfigError` when an entry does not combine with ``sampling``."""
    retried = attempt >= 2 and (retry.template is not None or retry.system is not None)
    if retried:
        template = attempt_template(retry, attempt, template)
        system = retry.system if retry.system is not None else system
    entry = retry.entry(attempt)
    if entry is not None:
        sampling = SamplingParams.from_mapping(entry[1], sampling)
    sampling = attempt_seed(sampling, attempt)
    if least_max_tokens is not None and sampling.max_tokens < least_max_tokens:
        sampling = dataclasses.replace(sampling, max_tokens=least_max_tokens)
    # read by name: the field is the engines' (a sampling without it has no budget to raise)
    thinking = getattr(sampling, THINKING_BUDGET, None)
    if least_thinking_tokens is not None and isinstance(thinking, int) and thinking < least_thinking_tokens:
        sampling = SamplingParams.from_mapping({THINKING_BUDGET: least_thinking_tokens}, sampling)
    return Sent(template, system, sampling, retry=retried)


def attempt_template(retry: RetrySettings, attempt: int, template: str | None) -> str | None:
    """The prompt template attempt ``attempt`` renders: ``retry_template`` from the second attempt
    on, else ``template`` (the job's)."""
    return retry.template if attempt >= 2 and retry.template is not None else template


def reads_previous(template: str | None) -> bool:
    """Whether ``template`` reads the variable ``previous`` (a syntax error: no; compiling it says why)."""
    return template is not None and PREVIOUS in template and PREVIOUS in variables_read(template)
