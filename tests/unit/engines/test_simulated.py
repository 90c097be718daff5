from __future__ import annotations

import json

from airflow_batchinfer.engines import GenerationRequest, create_engine


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
