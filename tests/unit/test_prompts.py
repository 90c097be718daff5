from __future__ import annotations

from typing import Any

import pytest

from airflow_batchinfer.engines import SamplingParams
from airflow_batchinfer.engines.base import GenerationRequest
from airflow_batchinfer.exceptions import ConfigError, OverQuickBudget
from airflow_batchinfer.prompts import build as prompts
from airflow_batchinfer.prompts import templates
from airflow_batchinfer.prompts.build import MAX_PROMPT_CHARS, PromptBuilder, PromptError


def test_template_over_record_fields_as_chat() -> None:
    b = PromptBuilder("Solve {{ question }} (id {{ record.id }})", system="Be brief.")
    req = b.build({"id": 7, "question": "2+2"}, request_id="7")
    assert req.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Solve 2+2 (id 7)"},
    ]
    assert req.metadata == {"record_id": "7", "attempt": 1, "role": "infer"}


def test_raw_prompt_without_chat() -> None:
    req = PromptBuilder("{{ q }}", chat=False).build({"q": "hi"}, request_id="1")
    assert req.prompt == "hi" and req.messages is None


def test_missing_field_is_a_prompt_error_not_a_crash() -> None:
    with pytest.raises(PromptError, match="'question' is undefined"):
        PromptBuilder("{{ question }}").build({"id": 1}, request_id="1")


def test_template_syntax_error_is_config_error() -> None:
    with pytest.raises(ConfigError, match="invalid prompt template"):
        PromptBuilder("{% for %}")


def test_sandbox_blocks_unsafe_access() -> None:
    with pytest.raises(PromptError):
        PromptBuilder("{{ q.__class__.__mro__[1].__subclasses__() }}").build({"q": "x"}, request_id="1")


def test_openai_batch_body_messages_and_sampling_override() -> None:
    b = PromptBuilder(None, sampling=SamplingParams(max_tokens=100, temperature=0.0))
    record = {
        "custom_id": "a",
        "body": {
            "messages": [{"role": "user", "content": "hi"}],
            "max_completion_tokens": 5,
            "temperature": 0.7,
            "stop": "END",
        },
    }
    req = b.build(record, request_id="a")
    assert req.messages == [{"role": "user", "content": "hi"}]
    assert (req.sampling.max_tokens, req.sampling.temperature, req.sampling.stop) == (5, 0.7, ("END",))
    with pytest.raises(PromptError, match="neither"):
        b.build({"custom_id": "b", "body": {"x": 1}}, request_id="b")


def test_retries_sample_differently_but_reproducibly() -> None:
    b = PromptBuilder("{{ q }}", sampling=SamplingParams(seed=42, temperature=0.8))
    seeds = [b.build({"q": "x"}, request_id="1", attempt=a).sampling.seed for a in (1, 2, 3, 2)]
    assert seeds[0] == 42 and len(set(seeds[:3])) == 3 and seeds[1] == seeds[3]


def test_estimate_tokens_counts_prompt_and_completion_budget() -> None:
    req = PromptBuilder("{{ q }}", chat=False, sampling=SamplingParams(max_tokens=50)).build(
        {"q": "x" * 40}, request_id="1"
    )
    assert req.estimate_tokens() == 40 // 4 + 1 + 50


@pytest.mark.parametrize("bad", [{"max_tokens": 0}, {"temperature": -0.1}, {"top_p": 0}, {"top_p": 1.5}])
def test_invalid_sampling(bad: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        SamplingParams.from_mapping(bad)


class Text(str):
    """A str subclass: Jinja prints it with its own ``__str__``."""

    def __str__(self) -> str:
        return f"<{super().__str__()}>"


PLAIN = "Q: {{ question }} ({{ n }})"
# (record, variables): what the fast path must render as the sandbox does, or leave to it.
CASES: list[tuple[dict[Any, Any], dict[Any, Any] | None]] = [
    ({"question": "What is {{ 1 + 1 }}?", "n": 3, "context": 'ünïcode "quoted"\r\n{% raw %}'}, None),
    ({"question": Text("sub"), "n": 1, "context": "c"}, None),  # a str subclass
    ({"question": "x", "n": True, "context": False}, None),  # bools print as Jinja prints them
    ({"question": "x", "n": None, "context": None}, None),
    ({"question": "x", "n": 2.5, "context": 1e300}, None),
    ({"question": "x", "n": -(10**40), "context": 10**40}, None),
    ({"question": "x", "n": 10**5000, "context": "c"}, None),  # over Python's int -> str digit limit
    ({"question": "y", "n": 2, "context": ["a", 1]}, None),  # a list
    ({"question": "z"}, None),  # a missing field: an error
    ({"question": "z", "n": 1, "context": "c", "self": "s"}, None),  # Jinja's own parameter: an error
    ({"question": "z", "n": 1, "context": "c"}, {"self": "s"}),
    ({"question": "z", "n": 1, "context": "c", 7: "an int key"}, None),  # not a keyword: an error
    ({"question": "z", "n": 1, "context": "c"}, {7: "an int key"}),
    ({"question": "a\r\nb\rc\n", "n": 1, "context": "\n\n"}, None),  # values keep their newlines
    ({"question": "field", "n": 1, "context": "c"}, {"question": "var", "n": 2.5}),  # variables win
    ({"question": "field", "context": "c"}, {"n": 4}),  # a variable fills a field the record lacks
    ({"question": "q" * (MAX_PROMPT_CHARS - 20), "n": 1, "context": "c"}, None),  # fits, or just over
    ({"question": "q" * MAX_PROMPT_CHARS, "n": 1, "context": "c"}, None),  # too long: the sandbox's error
    ({"question": "q" * 150_000, "n": 1, "context": "c" * 60_000}, None),  # over the quick budget's text
]


def outcome(fn: Any, *args: Any, **kwargs: Any) -> object:
    try:
        return fn(*args, **kwargs)
    except (PromptError, OverQuickBudget) as exc:
        return type(exc)


@pytest.mark.parametrize(
    "template",
    [
        PLAIN,
        "{{question}}/{{ n }}\n\nContext: {{ context }}\n",  # a trailing newline is kept
        "Q:\r\n{{ question }}\r{{ n }}\r\n\r\n",  # Jinja writes a template's newlines as "\n"
        "}} {{ question }}}",  # braces that open nothing are text
        "{{ true }} {{ question }}",  # a literal, not a field: Jinja renders it
        "{{ record }}",  # the whole record
        "{{ self }} {{ question }}",  # the template's own reference
        "{{ question | upper }}",  # a filter: Jinja renders it
    ],
)
@pytest.mark.parametrize("quick", [False, True])
def test_a_plain_template_fills_in_what_the_sandbox_renders(template: str, quick: bool) -> None:
    """Plain templates are filled in without Jinja; the result (or the error) is the sandbox's."""
    builder = PromptBuilder(template, chat=False)
    for record, variables in CASES:
        context = {**record, **(variables or {}), "record": record}
        expected = outcome(templates.render, template, context, quick=quick)
        got = outcome(builder.build, record, request_id="r", variables=variables, quick=quick)
        got = got.prompt if isinstance(got, GenerationRequest) else got
        assert got == expected, (template, record, variables)


def test_a_plain_template_over_text_and_integers_is_filled_in_without_jinja(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    builder = PromptBuilder(PLAIN, chat=False)

    def no_jinja(*args: Any, **kwargs: Any) -> str:
        raise AssertionError("rendered through Jinja")

    monkeypatch.setattr(prompts, "render", no_jinja)
    for quick in (False, True):
        req = builder.build({"question": "2+2\r\n", "n": -4, "id": 1}, request_id="r", quick=quick)
        assert req.prompt == "Q: 2+2\r\n (-4)"
    req = builder.build({"question": "q", "n": 1}, request_id="r", variables={"n": 2})
    assert req.prompt == "Q: q (2)"
    with pytest.raises(AssertionError, match="through Jinja"):  # Jinja's rules for anything else
        builder.build({"question": "q", "n": 1, "self": "s"}, request_id="r")


def test_variables_win_over_the_records_fields() -> None:
    builder = PromptBuilder("{{ question }} -> {{ output }}", chat=False)
    req = builder.build({"question": "q", "output": "field"}, request_id="r", variables={"output": "var"})
    assert req.prompt == "q -> var"
