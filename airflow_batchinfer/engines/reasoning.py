"""Reasoning models: what a request asks of them and how their output splits into reasoning and answer.

A request asks through three fields (``engines.sampling``): ``reasoning_effort`` and
``chat_template_kwargs`` reach the model's chat template as vLLM's OpenAI server passes them
(:func:`template_kwargs`: ``reasoning_effort`` itself, and ``enable_thinking`` false for the effort
``none``, true otherwise, unless the kwargs set it), and ``thinking_token_budget`` is vLLM's own
sampling field (the reasoning is ended when that many thinking tokens are spent).

The split (:class:`Split`) is the engine's, named by the ``reasoning_parser`` its deployment pins:
the vllm engine runs one of vLLM's reasoning parsers by name (:class:`VllmSplitter`), the transformers
engine splits on the delimiters of a parser of :data:`DELIMITER_PARSERS` the way vLLM's delimiter
parsers do (:class:`Delimiters`), and the openai engine reads the server's ``reasoning_content`` /
``reasoning``. An answer cut at ``max_tokens`` while its reasoning had not ended is
``truncated_in_thinking`` in its row.

Nothing here imports vLLM at import time (the worker and the run settings import it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_batchinfer.exceptions import ConfigError

#: vLLM's (and OpenAI's) reasoning efforts.
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


@dataclass(frozen=True)
class TemplateKwargs:
    """``chat_template_kwargs``: a JSON object, kept as its canonical text (hashable, so sampling
    settings holding it still group and compare)."""

    text: str

    @classmethod
    def of(cls, value: Mapping[str, Any]) -> TemplateKwargs:
        return cls(json.dumps(dict(value), sort_keys=True, separators=(",", ":")))

    def as_json(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.text)
        return value


def template_kwargs(effort: str | None, kwargs: TemplateKwargs | None) -> dict[str, Any]:
    """The keyword arguments the chat template is rendered with, as vLLM's OpenAI server builds them
    (``ChatCompletionRequest.build_chat_params``): the request's ``chat_template_kwargs``, and with a
    ``reasoning_effort`` the effort itself and ``enable_thinking`` (false for ``none``) where the
    kwargs leave it unset. A template that declares neither ignores them."""
    out = kwargs.as_json() if kwargs is not None else {}
    if effort is not None:
        out.setdefault("enable_thinking", effort != "none")
        out.setdefault("reasoning_effort", effort)
    return out


def prompt_refusal(effort: str | None, kwargs: TemplateKwargs | None, engine: str) -> str | None:
    """Why a raw-prompt request (no chat template) cannot take ``reasoning_effort`` or
    ``chat_template_kwargs``: both reach the model through its chat template only."""
    asked = [name for name, v in (("reasoning_effort", effort), ("chat_template_kwargs", kwargs)) if v]
    if not asked:
        return None
    return (
        f"{engine}: {' and '.join(asked)} go to the model through its chat template only, and this "
        "request is a raw prompt (a completions body): send chat messages, or remove them"
    )


@dataclass(frozen=True)
class Split:
    """An output split into its ``answer`` and its ``reasoning`` (``None``: no reasoning parsed),
    with the reasoning's tokens and whether it ``ended`` (false: the output stopped while thinking)."""

    answer: str
    reasoning: str | None = None
    reasoning_tokens: int = 0
    ended: bool = True


# ----------------------------------------------------------------------------- delimiter parsers
@dataclass(frozen=True)
class Delimiters:
    """A reasoning parser that splits on a start and an end delimiter, each one token of the model's
    vocabulary, as vLLM's ``BaseThinkingReasoningParser`` does: the output up to the end delimiter
    (after the start one, where the model wrote it: a chat template may have) is the reasoning, the
    rest the answer; an output without the end delimiter is all reasoning, not ended."""

    start: str
    end: str

    def token_ids(self, vocab: Mapping[str, int], parser: str) -> tuple[int, int]:
        """The delimiters' token ids in ``vocab``; a ConfigError when the model lacks either."""
        missing = [d for d in (self.start, self.end) if d not in vocab]
        if missing:
            raise ConfigError(
                f"reasoning_parser {parser}: this model's tokenizer has no token {' or '.join(missing)}: "
                "it is not a model this parser reads; unset reasoning_parser or pick the model's parser"
            )
        return vocab[self.start], vocab[self.end]

    @staticmethod
    def split_ids(ids: Sequence[int], start_id: int, end_id: int) -> tuple[list[int], list[int], bool]:
        """``ids`` as (reasoning ids, answer ids, ended): the delimiters themselves in neither."""
        ids = list(ids)
        if start_id in ids:
            ids = ids[ids.index(start_id) + 1 :]
        if end_id not in ids:
            return ids, [], False
        at = ids.index(end_id)
        return ids[:at], ids[at + 1 :], True


class ThinkingBudget:
    """A ``generate()`` logits processor that ends each row's reasoning after ``budget`` thinking
    tokens by forcing the end delimiter, as vLLM's ``thinking_token_budget`` does: a row thinks from
    its last start delimiter (the prompt's, where the template opened the reasoning) until an end one,
    and each token since that start counts."""

    def __init__(self, budget: int, start_id: int, end_id: int) -> None:
        self.budget, self.start_id, self.end_id = budget, start_id, end_id

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        for row, ids in enumerate(input_ids.tolist()):
            start = _last(ids, self.start_id)
            if start > _last(ids, self.end_id) and len(ids) - start - 1 >= self.budget:
                scores[row, :] = float("-inf")
                scores[row, self.end_id] = 0.0
        return scores


def _last(ids: list[int], token: int) -> int:
    """The index of the last ``token`` in ``ids`` (-1: none)."""
    for i in range(len(ids) - 1, -1, -1):
        if ids[i] == token:
            return i
    return -1


#: The parsers the transformers engine runs: vLLM's delimiter parsers of the same names.
DELIMITER_PARSERS: dict[str, Delimiters] = {
    "deepseek_r1": Delimiters("<think>", "</think>"),
    "seed_oss": Delimiters("<seed:think>", "</seed:think>"),
}


def delimiter_parser(name: str) -> Delimiters:
    """The delimiter parser ``name``; a ConfigError naming those there are."""
    if name not in DELIMITER_PARSERS:
        raise ConfigError(
            f"reasoning_parser {name!r} is not a parser the transformers engine runs: choose one of "
            f"{', '.join(sorted(DELIMITER_PARSERS))} (vLLM's delimiter parsers of those names), or run the "
            "model on a vllm pool, which runs any of vLLM's parsers"
        )
    return DELIMITER_PARSERS[name]


# ------------------------------------------------------------------------------------ vLLM's parsers
def vllm_parser_names() -> list[str]:
    """The reasoning parsers this vLLM has, by name."""
    from vllm.reasoning import ReasoningParserManager

    return list(ReasoningParserManager.list_registered())


def check_vllm_parser(name: Any) -> str:
    """``name``, a reasoning parser of this vLLM; a ConfigError listing them otherwise (checked before
    the engine loads, where vLLM would fail with less to go on)."""
    names = vllm_parser_names()
    if not isinstance(name, str) or name not in names:
        raise ConfigError(
            f"vllm engine option reasoning_parser={name!r} is not one of this vLLM's reasoning parsers: "
            f"choose the model's ({', '.join(names)})"
        )
    return name


class VllmSplitter:
    """One of vLLM's reasoning parsers by name, over the engine's tokenizer: splits a finished
    output as vLLM's OpenAI server does for a whole (not streamed) answer."""

    def __init__(self, name: str, tokenizer: Any, model_config: Any = None) -> None:
        from vllm.reasoning import ReasoningParserManager

        self.name = name
        self.parser = ReasoningParserManager.get_reasoning_parser(name)(tokenizer, model_config=model_config)
        self.tokenizer = tokenizer

    def split(
        self,
        text: str,
        token_ids: Sequence[int],
        messages: Sequence[Mapping[str, Any]] | None,
        effort: str | None,
        kwargs: TemplateKwargs | None,
    ) -> Split:
        """``text`` (of the generated ``token_ids``) split by the parser. Its reasoning tokens are the
        parser's count; where that is 0 for parsed reasoning (the delimiter parsers count tokens between
        a start and an end token, and a template that opens the reasoning in the prompt leaves no start
        token in the output) the reasoning's own tokens. It ended where there is none or the parser
        finds its end in the output."""
        reasoning, answer = self.parser.extract_reasoning(text, self._request(messages, effort, kwargs))
        if reasoning is None:
            return Split(text if answer is None else answer)
        return self.counted(reasoning, answer or "", token_ids)

    def counted(self, reasoning: str, answer: str, token_ids: Sequence[int]) -> Split:
        """The split of the generated ``token_ids`` into ``reasoning`` and ``answer`` (as this parser
        extracts them: here, or inside vLLM's parser composed with a tool parser) with its reasoning
        tokens and whether the reasoning ended."""
        ids = list(token_ids)
        count = int(self.parser.count_reasoning_tokens(ids))
        if count == 0 and reasoning:
            count = self._tokens_before_end(ids, reasoning)
        return Split(answer, reasoning, count, bool(self.parser.is_reasoning_end(ids)))

    def _tokens_before_end(self, ids: list[int], reasoning: str) -> int:
        """The generated tokens before the parser's end token (all of them where it has not ended),
        its start token left out; for a parser without one token to end on, the reasoning's text
        tokenized again (at most the tokens generated)."""
        end = getattr(self.parser, "end_token_id", None)
        if not isinstance(end, int):
            return min(len(ids), len(self.tokenizer.encode(reasoning, add_special_tokens=False)))
        start = getattr(self.parser, "start_token_id", None)
        upto = ids.index(end) if end in ids else len(ids)
        return sum(1 for t in ids[:upto] if t != start)

    @staticmethod
    def _request(
        messages: Sequence[Mapping[str, Any]] | None, effort: str | None, kwargs: TemplateKwargs | None
    ) -> Any:
        """The ``ChatCompletionRequest`` the parser reads (some read its template kwargs), unvalidated:
        the engine has rendered the messages already."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        return ChatCompletionRequest.model_construct(
            messages=list(messages or ()),
            reasoning_effort=effort,
            chat_template_kwargs=kwargs.as_json() if kwargs is not None else None,
        )


# ------------------------------------------------------------------------------------------- rows
#: A row's field: its answer was cut at ``max_tokens`` while the model was still thinking.
TRUNCATED_IN_THINKING = "truncated_in_thinking"
#: The fields a row's generation writes for its reasoning (a new generation drops an earlier one's).
ROW_FIELDS = ("reasoning", "reasoning_tokens", TRUNCATED_IN_THINKING)


def row_fields(reasoning: str | None, tokens: int, ended: bool, finish_reason: str | None) -> dict[str, Any]:
    """A row's (or a candidate's) reasoning fields: ``reasoning`` and ``reasoning_tokens`` where
    reasoning was parsed, ``truncated_in_thinking: true`` where the output was cut at ``max_tokens``
    (``finish_reason`` ``length``) before the reasoning ended; ``{}`` for a model that did not reason."""
    if reasoning is None:
        return {}
    out: dict[str, Any] = {"reasoning": reasoning, "reasoning_tokens": tokens}
    if finish_reason == "length" and not ended:
        out[TRUNCATED_IN_THINKING] = True
    return out


def openai_message(role: str, answer: str | None, reasoning: str | None) -> dict[str, Any]:
    """An OpenAI chat ``message`` as vLLM's server writes it for a reasoning model: the answer as
    ``content`` (``null`` where only reasoning was generated), the reasoning as ``reasoning`` (vLLM's
    name) and ``reasoning_content`` (the older name DeepSeek's API and earlier vLLMs use)."""
    if reasoning is None:
        return {"role": role, "content": answer}
    return {"role": role, "content": answer or None, "reasoning": reasoning, "reasoning_content": reasoning}
