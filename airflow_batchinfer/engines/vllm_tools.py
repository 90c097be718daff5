"""Tool calls on the ``vllm`` engine, as ``vllm serve`` makes them: the tools rendered by the chat
template, the answer constrained where ``tool_choice`` asks for a call, and the calls parsed from
the text by vLLM's own tool parser, the one the pool pins (engine option ``tool_parser``, vLLM's
``--tool-call-parser``: ``hermes``, ``llama3_json``, ``mistral``, ...), composed with the reasoning
parser the pool pins (engine option ``reasoning_parser``) as the server composes them.

Per request it builds vLLM's ``ChatCompletionRequest`` (its validation is the server's) and hands
it to vLLM's composed parser (``ParserManager.get_parser``, what the server builds): its
``adjust_request`` gives the constraint ``required`` or a named function asks for (a JSON schema of
the calls, or the parser's structural tag) and whether special tokens stay in the text; its
``parse`` splits off the reasoning first and reads the calls from the answer after it (a reasoning
model's calls are its answer's, never its thinking's), giving the reasoning, the calls and the
answer's text around them: the output is parsed once, the engine splitting it no further.
``finish_reason`` is ``tool_calls`` where the server says so (calls made under ``auto``, or
``required`` stopped normally); a named function's call keeps its own (``stop``), as OpenAI's does.
``parallel_tool_calls: false`` keeps the first call. Nothing is executed.

vLLM is imported only when a request offers tools (the module imports without it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow_batchinfer.engines.base import GenerationRequest
from airflow_batchinfer.engines.tools import NamedTool, ToolCall
from airflow_batchinfer.exceptions import ConfigError


def tool_parser_names() -> list[str]:
    """The tool parsers this vLLM registers, sorted."""
    from vllm.tool_parsers import ToolParserManager

    return sorted(ToolParserManager.list_registered())


def check_tool_parser(name: Any) -> str | None:
    """``name`` if this vLLM has that tool parser (``None``: none asked for); else a ConfigError
    listing those it has (raised when the engine starts, before any job)."""
    if name is None:
        return None
    names = tool_parser_names()
    if not isinstance(name, str) or name not in names:
        raise ConfigError(
            f"vllm engine option tool_parser={name!r}: this vLLM has no such tool parser; give one of "
            f"{', '.join(names)} (the one the model's chat template writes calls in, as for vllm serve "
            "--tool-call-parser), or leave it unset for a pool that serves no tool calls"
        )
    return name


@dataclass
class ToolTurn:
    """One request's tool calling: vLLM's request (as adjusted by the parser) and the parser."""

    chat: Any  # vLLM's ChatCompletionRequest
    parser: Any  # vLLM's Parser, or None (tool_choice none: the tools are rendered, no call parsed)

    def sampling_overrides(self) -> dict[str, Any]:
        """What the request's ``vllm.SamplingParams`` takes from the adjusted request: the
        constraint a call needs (``None``: the request's own stays) and ``skip_special_tokens``."""
        out: dict[str, Any] = {"skip_special_tokens": self.chat.skip_special_tokens}
        if self.chat.structured_outputs is not None:
            out["structured_outputs"] = self.chat.structured_outputs
        return out

    def template_tools(self) -> list[dict[str, Any]]:
        """The tools for the chat template, as vLLM's request holds them (``vllm serve`` renders
        those: its defaults, ``description: null`` say, are in the prompt too)."""
        return [t.model_dump() for t in self.chat.tools]

    def calls(
        self, text: str, token_ids: Any, finish_reason: str
    ) -> tuple[str | None, str, tuple[ToolCall, ...] | None, str]:
        """The output's reasoning (``None``: none parsed, or no reasoning parser), the answer's text,
        its calls (``None``: none) and the finish reason."""
        if self.parser is None:
            return None, text, None, finish_reason
        reasoning, content, found = self.parser.parse(
            text, self.chat, enable_auto_tools=True, model_output_token_ids=list(token_ids)
        )
        calls = tuple(ToolCall(c.id or _call_id(), c.name, c.arguments) for c in found or ())
        if calls and self.chat.parallel_tool_calls is False:
            calls = calls[:1]
        # as vLLM's server: calls made under auto, or required that stopped (a named call keeps its own)
        choice = self.chat.tool_choice
        if (choice == "auto" and calls) or (choice == "required" and finish_reason == "stop"):
            finish_reason = "tool_calls"
        return reasoning, content or "", calls or None, finish_reason


def _call_id() -> str:
    """A call's id where the parser gave none, as vLLM's server makes it (``chatcmpl-tool-…``)."""
    from vllm.renderers.chat_utils import make_tool_call_id

    return str(make_tool_call_id())


class VllmTools:
    """The vllm engine's tool calling with the tool parser named ``name`` (``None``: the pool pins
    none, so only ``tool_choice: none`` runs: the tools rendered, no call parsed), composed with the
    reasoning parser named ``reasoning`` (``None``: the model does not reason)."""

    def __init__(
        self, name: str | None, tokenizer: Any, model_config: Any, reasoning: str | None = None
    ) -> None:
        self.name = name
        self.tokenizer = tokenizer
        self.model_config = model_config
        self._parser_cls: Any = None
        if name is not None:
            from vllm.parser.parser_manager import ParserManager

            try:
                self._parser_cls = ParserManager.get_parser(
                    tool_parser_name=name,
                    reasoning_parser_name=reasoning,
                    enable_auto_tools=True,
                    tokenizer=tokenizer,
                )
            except TypeError as exc:  # the parser needs tokens this model's tokenizer lacks
                raise ConfigError(
                    f"vllm engine option tool_parser={name!r} cannot read this model's answers ({exc}): "
                    "give the parser of the model's own tool-call format"
                ) from None

    def refusal(self, request: GenerationRequest) -> str | None:
        """Why this engine cannot make ``request``'s calls (``None``: it can, or it offers no tools)."""
        s = request.sampling
        if not s.tools:
            return None
        if request.messages is None:
            return "tools need chat messages (a completions prompt has no tools): send messages"
        if self.name is None and s.tool_choice != "none":
            return (
                "this pool's vllm engine has no tool parser, so it cannot read the calls an answer makes: "
                'give the pool the engine option {"tool_parser": NAME} (the model\'s format, as for vllm '
                'serve --tool-call-parser: hermes, llama3_json, mistral, ...), or send tool_choice "none"'
            )
        if s.structured_outputs is not None and (
            s.tool_choice == "required" or isinstance(s.tool_choice, NamedTool)
        ):
            return (
                "tool_choice required or a named function constrains the answer to the call (vLLM would "
                "replace the request's structured output): remove structured_outputs/response_format"
            )
        return None

    def turn(self, request: GenerationRequest) -> ToolTurn:
        """``request``'s vLLM request and parser (the request offers tools and has no refusal)."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        s = request.sampling
        body: dict[str, Any] = {
            "model": "batchinfer",
            "messages": list(request.messages or ()),
            "tools": [t.as_json() for t in s.tools],
            "parallel_tool_calls": s.parallel_tool_calls,
        }
        if s.tool_choice is not None:
            body["tool_choice"] = (
                s.tool_choice.as_json() if isinstance(s.tool_choice, NamedTool) else s.tool_choice
            )
        if s.structured_outputs is not None:
            body["structured_outputs"] = s.structured_outputs.as_json()
        if s.reasoning_effort is not None:  # a reasoning parser may read them (Qwen3's enable_thinking)
            body["reasoning_effort"] = s.reasoning_effort
        if s.chat_template_kwargs is not None:
            body["chat_template_kwargs"] = s.chat_template_kwargs.as_json()
        chat = ChatCompletionRequest(**body)
        if self._parser_cls is None or chat.tool_choice == "none":
            return ToolTurn(chat, None)
        parser = self._parser_cls(self.tokenizer, chat.tools, model_config=self.model_config)
        return ToolTurn(parser.adjust_request(chat), parser)
