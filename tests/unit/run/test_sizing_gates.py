"""``batchinfer plan --review-delay`` (issue 40): per gate the GPU-hours idle under gate_idle keep vs
release, beside the planned rounds' tail idle; a pure estimate."""

from __future__ import annotations

import pytest

from airflow_batchinfer.cli import main
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.run.sizing import plan_run
from airflow_batchinfer.run.sizing_gates import gate_idle, parse_delay


def test_keep_idles_the_whole_wait_release_only_what_it_keeps_warm() -> None:
    plan = plan_run(1_000_000, 32, 2000.0, approval_rate=0.7, max_rounds=3)
    est = gate_idle(plan, 12 * 3600, gate_keep_warm_s=300, idle_ttl_s=600)
    assert est.gates == len(plan.rounds) - 1 == 2  # a gate before each later round
    assert est.keep_gpu_h_per_gate == 32 * 12  # 32 GPUs for 12 h
    assert est.release_gpu_h_per_gate == 32 * 900 / 3600  # kept 5 min, then the pool's 10 min
    assert est.tail_idle_gpu_h == round(plan.tail_idle_gpu_s / 3600, 4)
    assert est.keep_total_gpu_h == pytest.approx(2 * 384 + est.tail_idle_gpu_h)
    assert est.release_total_gpu_h == pytest.approx(2 * 8 + est.tail_idle_gpu_h)


def test_an_answer_before_the_release_costs_what_keep_does() -> None:
    plan = plan_run(1_000_000, 4, 2000.0, approval_rate=0.7, max_rounds=2)
    est = gate_idle(plan, 120, gate_keep_warm_s=300, idle_ttl_s=600)
    assert est.keep_gpu_h_per_gate == est.release_gpu_h_per_gate == round(4 * 120 / 3600, 4)


def test_one_round_has_no_gate() -> None:
    est = gate_idle(plan_run(1_000, 2, 2000.0), 3600, idle_ttl_s=600)
    assert est.gates == 0 and est.keep_total_gpu_h == est.release_total_gpu_h == est.tail_idle_gpu_h


@pytest.mark.parametrize(
    ("text", "seconds"), [("3600", 3600), ("45s", 45), ("30m", 1800), ("12h", 43200), ("1.5d", 129600)]
)
def test_delays_parse(text: str, seconds: float) -> None:
    assert parse_delay(text) == seconds


def test_a_bad_delay_names_the_flag() -> None:
    with pytest.raises(ConfigError, match="--review-delay"):
        parse_delay("tomorrow")


def test_the_cli_prints_it_beside_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--records", "1000000", "--gpus", "32", "--tokens-per-s", "2000", "--max-rounds", "3"]
    main([*args, "--approval-rate", "0.7", "--review-delay", "12h"])
    out = capsys.readouterr().out
    assert "review gates: 2, each answered after 12.0 h" in out and "keep 384.00, release 8.00" in out
