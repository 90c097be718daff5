"""``batchinfer pool metrics`` (issue 40): a pool's replicas, leases and busy workers as Prometheus
text, from one pure render function."""

from __future__ import annotations

from airflow_batchinfer.pools.prometheus import METRICS, render_pool_metrics


def _samples(text: str) -> dict[str, str]:
    return {
        line.split("{")[0]: line.rsplit(" ", 1)[1] for line in text.splitlines() if not line.startswith("#")
    }


def test_every_gauge_with_its_help_type_and_pool_label() -> None:
    text = render_pool_metrics(
        "kubernetes://batch/llm", replicas=4, ready=3, leases={"dag/run1": 4, "dag/run2": 2}, busy=2
    )
    assert _samples(text) == {
        "batchinfer_pool_replicas": "4",
        "batchinfer_pool_ready_replicas": "3",
        "batchinfer_pool_leased_replicas": "4",  # the largest live demand, not the sum
        "batchinfer_pool_leases": "2",
        "batchinfer_pool_busy_replicas": "2",
    }
    for name in METRICS:
        assert f"# TYPE {name} gauge" in text and f"# HELP {name} " in text
    assert 'batchinfer_pool_busy_replicas{pool="kubernetes://batch/llm"} 2' in text
    assert text.endswith("\n")  # a textfile collector reads whole lines


def test_an_idle_pool_has_no_lease_and_unknown_busy_is_left_out() -> None:
    text = render_pool_metrics('local://a"b', replicas=0, ready=0, leases={}, busy=None)
    samples = _samples(text)
    assert samples["batchinfer_pool_leased_replicas"] == "0" and samples["batchinfer_pool_leases"] == "0"
    assert "batchinfer_pool_busy_replicas" not in text  # nobody answered: not a 0
    assert 'pool="local://a\\"b"' in text  # the label value escaped
