from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor

from airflow_batchinfer.engines import GenerationRequest, create_engine
from airflow_batchinfer.engines.simulated import until


def req(i: int, *, role: str = "infer", attempt: int = 1, prompt: str = "hello") -> GenerationRequest:
    return GenerationRequest(
        f"r{i}", prompt=prompt, metadata={"record_id": f"r{i}", "attempt": attempt, "role": role}
    )


async def test_deterministic_outputs_and_named_simulated() -> None:
    e = create_engine("simulated")
    a = await e.generate([req(1), req(2, prompt="other")])
    b = await e.generate([req(1), req(2, prompt="other")])
    assert [r.text for r in a] == [r.text for r in b]
    assert a[0].text != a[1].text and a[0].text.startswith("simulated")
    assert e.describe()["engine"] == "simulated"


async def test_judge_verdicts_follow_approval_rate_by_id_and_attempt() -> None:
    e = create_engine("simulated", approval_rate=0.3)
    out = await e.generate([req(i, role="judge") for i in range(2000)])
    rate = sum(json.loads(r.text)["approved"] for r in out) / 2000
    assert 0.25 < rate < 0.35
    again = await e.generate([req(i, role="judge", attempt=2) for i in range(2000)])
    assert [r.text for r in out] != [r.text for r in again]  # a retry gets a fresh draw


async def test_fail_marker_fails_only_that_element() -> None:
    e = create_engine("simulated", fail_marker="BAD")
    out = await e.generate([req(1), req(2, prompt="a BAD one"), req(3)])
    assert [r.ok for r in out] == [True, False, True]
    assert "BAD" in (out[1].error or "")


async def test_a_batch_never_ends_before_its_due_time() -> None:
    loop = asyncio.get_running_loop()
    clock = ThreadPoolExecutor(max_workers=1)
    for wait in (0.0, 0.0005, 0.003, 0.02):  # inside the thread's last stretch, and beyond it
        due = loop.time() + wait
        await until(due, clock)
        assert loop.time() >= due
    e = create_engine("simulated", latency_base_s=0.01)
    started = loop.time()
    await e.generate([req(1)])
    assert loop.time() - started >= 0.01
    clock.shutdown()


async def test_a_busy_device_clock_leaves_the_loops_timer_to_end_the_wait() -> None:
    loop = asyncio.get_running_loop()
    clock = ThreadPoolExecutor(max_workers=1)
    clock.submit(time.sleep, 2.0)  # its one thread busy: the wait's sleep queues behind it
    due = loop.time() + 0.01
    await until(due, clock)
    assert due <= loop.time() < due + 1.5  # ended by the timer, not seconds later by the clock
    clock.shutdown(wait=False)


async def test_the_device_clock_ends_a_wait_the_loops_timer_would_end_late() -> None:
    """The loop's own timer made useless (it never fires): the clock's thread alone ends the wait,
    at its due time, as a device's output wakes the loop."""
    loop = asyncio.get_running_loop()
    clock = ThreadPoolExecutor(max_workers=1)
    real_call_at = loop.call_at
    try:
        loop.call_at = lambda when, cb, *args, **kw: real_call_at(when + 3600, cb, *args, **kw)  # type: ignore[method-assign]
        due = loop.time() + 0.001
        await asyncio.wait_for(until(due, clock), timeout=5)
        assert loop.time() >= due
    finally:
        loop.call_at = real_call_at  # type: ignore[method-assign]
        clock.shutdown()


async def test_close_stops_the_engines_clock() -> None:
    e = create_engine("simulated", latency_base_s=0.001)
    await e.generate([req(1)])
    await e.close()
    assert e.clock._shutdown  # type: ignore[attr-defined]


async def test_images_are_said_to_be_ignored_in_every_answer() -> None:
    """No model sees a request's images on the simulated engine: its answers say so."""
    from airflow_batchinfer.engines.base import SamplingParams
    from airflow_batchinfer.engines.images import LoadedImage
    from tests.support.images import png

    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is it?"}, image]}]
    loaded = (LoadedImage(png(4, 4), "png", 4, 4), LoadedImage(png(4, 4), "png", 4, 4))
    seen = GenerationRequest(
        "r1", messages=messages, images=loaded, sampling=SamplingParams(n=2, temperature=1.0)
    )
    text_only = GenerationRequest("r1", messages=[{"role": "user", "content": "what is it?"}])
    e = create_engine("simulated")
    (with_images,), (without,) = await e.generate([seen]), await e.generate([text_only])
    assert all(c.text.startswith("[simulated: 2 image(s) ignored] ") for c in with_images.choices)
    assert not without.text.startswith("[simulated")
