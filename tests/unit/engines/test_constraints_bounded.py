"""Issue 37, item 3: one record's ``response_format`` schema (or ``structured_outputs`` regex) must not
stall a shared worker. Every check of a user-supplied constraint is bounded (its JSON's size and
nesting, which bound the check's time and recursion) and, on a worker's event loop, runs in a thread.

Before: an in-place job checked an OpenAI batch body's schema inline on the loop (a ~1 MiB schema
held ``/v1/health`` for seconds), of any size or depth.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from airflow_batchinfer.engines import sampling, structured
from airflow_batchinfer.prompts.build import PromptBuilder, PromptError

pytestmark = pytest.mark.security


def _schema_of(properties: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"field_{i:06d}": {"type": "string"} for i in range(properties)}}


def _deep(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def _record(schema: dict[str, Any]) -> dict[str, Any]:
    response_format = {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}
    body = {"messages": [{"role": "user", "content": "hi"}], "response_format": response_format}
    return {"custom_id": "r1", "body": body}


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        (_schema_of(5_000), "larger than 65536 bytes of JSON"),  # ~150 KB: MAX_CONSTRAINT_BYTES
        (_deep(200), "nested deeper than 64 levels"),  # MAX_CONSTRAINT_DEPTH; a RecursionError before
    ],
    ids=["oversized", "too-deep"],
)
def test_an_unbounded_schema_is_that_records_error_with_the_reason(schema: dict[str, Any], why: str) -> None:
    """A PromptError is the record's error row (the jobs catch it), never a failed job."""
    with pytest.raises(PromptError, match=r"record 'r1': body field response_format=.* is refused: ") as err:
        PromptBuilder(None, engine="vllm").build(_record(schema), request_id="r1")
    assert why in str(err.value) and str(err.value).endswith("fix or remove it")
    assert len(str(err.value)) < 1_000  # the reason names the bound; it does not carry the schema


def test_every_reader_of_a_constraint_holds_it_to_the_bounds() -> None:
    regex = {"regex": "a" * 65_537}
    assert "larger than" in (sampling.refusal("structured_outputs", regex, in_body=False) or "")
    text = {"json": "[" * 100_000 + "]" * 100_000}  # JSON text nested past the parser's recursion
    assert "is refused" in (sampling.refusal("structured_outputs", text) or "")
    with pytest.raises(ValueError, match="nested deeper"):
        structured.read({"response_format": _record(_deep(40))["body"]["response_format"]})
    fitting = _record(_schema_of(100))["body"]["response_format"]  # ~3 KB: checked as before
    assert structured.problem("response_format", fitting) is None


def test_the_check_of_a_bodys_constraint_runs_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ticker on the loop must advance while the schema is being checked: inline (before) the
    loop is held for the whole check and the ticker cannot run until it is over."""
    ticks = 0
    advanced: list[bool] = []
    checked_in: list[str] = []
    check = structured._check_schema

    def watched(schema: Any, where: str) -> None:
        checked_in.append(threading.current_thread().name)
        start, deadline = ticks, time.monotonic() + 2.0
        while ticks == start and time.monotonic() < deadline:  # the ticker runs, or never will
            time.sleep(0.001)
        advanced.append(ticks > start)
        check(schema, where)

    monkeypatch.setattr(structured, "_check_schema", watched)
    builder = PromptBuilder(None, engine="vllm")

    async def main() -> None:
        nonlocal ticks
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        try:
            request = await builder.abuild(_record(_schema_of(50)), request_id="r1")
        finally:
            stop.set()
            await task
        assert request.sampling.structured_outputs is not None

    asyncio.run(main())
    assert advanced and all(advanced), "the schema was checked on the event loop: the ticker could not run"
    assert threading.main_thread().name not in checked_in


def test_the_builder_remembers_a_large_bodys_decision_by_digest_not_by_its_bytes() -> None:
    """Refused or not, each distinct body's decision is remembered (a batch file's records mostly
    share theirs): by its fields' digest when they are long, so 16 records with distinct 80 KiB
    schemas leave the builder holding kilobytes, not a megabyte (a worker's job holds up to 4,096)."""
    import gc
    import tracemalloc

    builder = PromptBuilder(None)
    records = [_record(_schema_of(2000) | {"title": f"r{i}"}) for i in range(16)]
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for record in records:
            with pytest.raises(PromptError, match="larger than 65536 bytes"):
                builder.build(record, request_id="r1")
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 256 * 1024, kept
