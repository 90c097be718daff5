from __future__ import annotations

import pytest

from airflow_batchinfer.engines import SamplingParams
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.prompts import PromptBuilder, PromptError


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


@pytest.mark.parametrize(
    "template",
    [
        "Q: {{ question }}",
        "{{question}}/{{ n }}\n\nContext: {{ context }}\n",  # a trailing newline is kept
        "Q:\r\n{{ question }}\r",  # Jinja writes a template's newlines as "\n"
        "}} {{ question }}}",  # braces that open nothing are text
        "{{ true }} {{ question }}",  # a literal, not a field: Jinja renders it
        "{{ record }}",  # the whole record
        "{{ question | upper }}",  # a filter: Jinja renders it
    ],
)
def test_a_plain_template_fills_in_what_the_sandbox_renders(template: str) -> None:
    """Plain templates are filled in without Jinja; the result (or the error) is the sandbox's."""
    from airflow_batchinfer.prompts import MAX_PROMPT_CHARS, render

    builder = PromptBuilder(template, chat=False)
    records: list[dict[str, object]] = [
        {"question": "What is {{ 1 + 1 }}?", "n": 3, "context": 'ünïcode "quoted"\r\n{% raw %}'},
        {"question": "x", "n": 2.5, "context": None},  # a float and None: Jinja's printing
        {"question": "y", "n": True, "context": ["a", 1]},  # a bool and a list
        {"question": "z", "n": -(10**40), "context": ""},
        {"question": "z"},  # a missing field: an error
        {"question": "q" * MAX_PROMPT_CHARS, "n": 1, "context": "c"},  # too long: the sandbox's error
    ]
    for record in records:
        try:
            expected: object = render(template, {**record, "record": record})
        except PromptError as exc:
            expected = type(exc)
        try:
            got: object = builder.build(record, request_id="r").prompt
        except PromptError as exc:
            got = type(exc)
        assert got == expected, (template, record)


def test_variables_win_over_the_records_fields() -> None:
    builder = PromptBuilder("{{ question }} -> {{ output }}", chat=False)
    req = builder.build({"question": "q", "output": "field"}, request_id="r", variables={"output": "var"})
    assert req.prompt == "q -> var"
