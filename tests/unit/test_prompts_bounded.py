"""Prompt templates render in a bounded sandbox: a template (or a record) that would allocate or
compute without bound is a PromptError on that record, never a stalled or dead worker."""

from __future__ import annotations

import time
from typing import Any

import pytest

from airflow_batchinfer.engines.base import GenerationRequest
from airflow_batchinfer.judges.llm import LLMJudge
from airflow_batchinfer.prompts import build as prompts
from airflow_batchinfer.prompts import render_budget
from airflow_batchinfer.prompts.build import PromptBuilder, PromptError

pytestmark = pytest.mark.security

MAX_PROMPT_CHARS = 1_000_000  # prompts.MAX_PROMPT_CHARS (checked below)


# 3**13 (1.6 million) macro calls without a loop or a character of output
FAN_OUT = (
    "{% macro m0() %}{% endmacro %}"
    + "".join(
        f"{{% macro m{i}() %}}{{{{ m{i - 1}() }}}}{{{{ m{i - 1}() }}}}{{{{ m{i - 1}() }}}}{{% endmacro %}}"
        for i in range(1, 14)
    )
    + "{{ m13() }}"
)


def build(template: str, record: dict[str, Any] | None = None) -> GenerationRequest:
    return PromptBuilder(template, chat=False).build(record or {"id": 1}, request_id="1")


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("template", "record"),
    [
        ("{{ 'x' * 10**7 }}", {}),  # folded at compile time by an unguarded sandbox
        ("{{ q * n }}", {"q": "x", "n": 10**7}),
        ("{{ [q] * n }}", {"q": "x", "n": 10**7}),
        ("{{ (n ** m) > 0 }}", {"n": 10, "m": 10**6}),
        ("{{ n * n * n * n }}", {"n": 10**20000}),
        ("{{ q }}", {"q": "x" * (MAX_PROMPT_CHARS + 1)}),
        ("{% for i in range(2000) %}{{ q }}{% endfor %}", {"q": "x" * 1000}),
        (
            "{% set ns = namespace(s='ab') %}{% for i in range(24) %}{% set ns.s = ns.s ~ ns.s %}"
            "{% endfor %}{{ ns.s | length }}",
            {},
        ),
        (
            "{% set ns = namespace(s='ab') %}{% for i in range(24) %}{% set ns.s = ns.s + ns.s %}"
            "{% endfor %}{{ ns.s | length }}",
            {},
        ),
        ("{{ q.center(n) | length }}", {"q": "x", "n": 10**8}),
        ("{{ q | center(n) | length }}", {"q": "x", "n": 10**8}),
        ("{{ q.replace('', q) | length }}", {"q": "x" * 5000}),
        ("{{ ('%0' ~ n ~ 'd') | format(1) | length }}", {"n": 10**8}),
        ("{{ '{:>100000000}'.format(1) | length }}", {}),
    ],
)
def test_unbounded_templates_are_prompt_errors(template: str, record: dict[str, Any]) -> None:
    started = time.monotonic()
    with pytest.raises(PromptError, match=r"too large|longer than|too many steps"):
        PromptBuilder(template, chat=False).build({"id": 1, **record}, request_id="1")
    assert time.monotonic() - started < 10


@pytest.mark.timeout(30)
def test_loops_are_bounded_even_without_output(monkeypatch: pytest.MonkeyPatch) -> None:
    # the step count is under test: the 2 s bound (tested below) must not win on a slow machine
    monkeypatch.setattr(render_budget, "MAX_RENDER_SECONDS", 60.0)
    started = time.monotonic()
    with pytest.raises(PromptError, match="too many steps"):
        build("{% for i in range(3000) %}{% for j in range(3000) %}{% endfor %}{% endfor %}")
    with pytest.raises(PromptError, match="too many steps"):
        build(FAN_OUT)
    assert time.monotonic() - started < 10


def test_a_rendering_past_its_time_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(render_budget, "MAX_RENDER_SECONDS", 0.0)  # every step is past the deadline
    with pytest.raises(PromptError, match=r"took too long \(over 0 s for one record\)"):
        build(FAN_OUT)


def test_a_huge_exponent_is_refused_before_it_is_computed() -> None:
    with pytest.raises(PromptError, match="too large"):
        build("{{ 10 ** (10 ** 8) }}")  # 332 million bits: the sandbox never starts computing it
    with pytest.raises(PromptError, match="too large"):
        build("{{ n ** m }}", {"n": 10, "m": 10**8})


def test_errors_other_than_template_errors_are_prompt_errors() -> None:
    with pytest.raises(PromptError, match="TypeError"):
        build("{{ q - 1 }}", {"q": "x"})
    with pytest.raises(PromptError):
        build("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}")  # RecursionError


def test_ordinary_templates_still_render() -> None:
    assert prompts.MAX_PROMPT_CHARS == MAX_PROMPT_CHARS
    assert build("{{ 'ab' * 3 }}-{{ 2 ** 10 }}-{{ n * 2 }}", {"n": 21}).prompt == "ababab-1024-42"
    assert build("{% for x in xs %}{{ x }},{% endfor %}", {"xs": [1, 2, 3]}).prompt == "1,2,3,"
    assert build("{{ q | center(9) }}|{{ '{:>4}'.format(q) }}|{{ '%3d' % 7 }}", {"q": "x"}).prompt == (
        "    x    |   x|  7"
    )
    assert build("{{ q }}", {"q": "y" * MAX_PROMPT_CHARS}).prompt == "y" * MAX_PROMPT_CHARS
    assert build("{{ record.id }} {{ xs | join(', ') }}", {"id": 12345678901, "xs": ["a", "b"]}).prompt == (
        "12345678901 a, b"
    )


async def test_the_llm_judge_template_is_bounded_too() -> None:
    judge = LLMJudge("{{ result * 10**7 }}")
    calls: list[Any] = []

    async def generate(requests: list[Any]) -> list[Any]:
        calls.append(requests)
        return []

    from airflow_batchinfer.judges import JudgeItem

    (verdict,) = await judge.judge([JudgeItem({}, "x", "1")], generate)
    assert not verdict.approved and "too large" in verdict.reason
    assert calls == []


async def test_abuild_renders_ordinary_templates_inline_and_heavy_ones_in_a_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In-place retries and single judge items render from the event loop: inline only while the
    rendering stays within the quick budget (a millisecond or two), else again in a thread."""
    import asyncio

    threads: list[Any] = []
    to_thread = asyncio.to_thread

    async def counting(fn: Any, *args: Any, **kwargs: Any) -> Any:
        threads.append(fn)
        return await to_thread(fn, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", counting)
    plain = PromptBuilder("Q: {{ q }}", chat=False)
    assert (await plain.abuild({"q": "hi"}, request_id="1")).prompt == "Q: hi"
    assert threads == []
    heavy = PromptBuilder("{% for i in range(5000) %}{{ i % 10 }}{% endfor %}", chat=False)
    request = await heavy.abuild({}, request_id="1")
    assert request.prompt == heavy.build({}, request_id="1").prompt and len(request.prompt) == 5000
    assert len(threads) == 1
    with pytest.raises(PromptError, match="too many steps"):
        await PromptBuilder(
            "{% for i in range(3000) %}{% for j in range(3000) %}{% endfor %}{% endfor %}"
        ).abuild({}, request_id="1")
    assert len(threads) == 2
