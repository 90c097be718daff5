"""A manifest's ``engine_stats`` (:class:`~airflow_batchinfer.state.docs.EngineTelemetry`): stored and
read back as written, absent from manifests written before it (they still read, and stay without),
and another version or shape of it refused, naming the file and the remedy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.exceptions import StorageError
from airflow_batchinfer.state.docs import EngineTelemetry, GaugeSpan, read_job_manifest, write_job_manifest
from tests.support.fake_jobs import job_manifest

TELEMETRY = EngineTelemetry(
    engine_id="e1",
    started_at=1_700_000_000.0,
    seconds=12.5,
    samples=13,
    counters={"generation_tokens": 4096, "prompt_tokens": 9000, "prefix_cache_queries": 9000,
              "prefix_cache_hits": 6000, "preemptions": 2},
    at_start={"generation_tokens": 10, "prompt_tokens": 20, "prefix_cache_queries": 20,
              "prefix_cache_hits": 0, "preemptions": 0},
    gauges={"kv_cache_usage": GaugeSpan(peak=0.93, mean=0.61), "running": GaugeSpan(peak=64, mean=40.2),
            "waiting": GaugeSpan(peak=12, mean=3.0)},
)  # fmt: skip


def stored(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def test_engine_stats_are_stored_and_read_back_as_written(tmp_path: Path) -> None:
    uri = tmp_path / "m.json"
    write_job_manifest(str(uri), job_manifest(engine_stats=TELEMETRY))
    doc = stored(uri)["engine_stats"]
    assert doc["version"] == 1 and doc["gauges"]["kv_cache_usage"] == {"peak": 0.93, "mean": 0.61}
    back = read_job_manifest(str(uri))
    assert back is not None and back.engine_stats == TELEMETRY


def test_a_manifest_from_before_engine_stats_still_reads_and_stays_without(tmp_path: Path) -> None:
    uri = tmp_path / "old.json"
    write_job_manifest(str(uri), job_manifest(engine_stats=TELEMETRY))
    old = stored(uri)
    del old["engine_stats"]  # as a worker of the previous release wrote it
    uri.write_text(json.dumps(old))
    back = read_job_manifest(str(uri))
    assert back is not None and back.engine_stats is None
    assert "engine_stats" not in json.loads(back.encode())
    none = tmp_path / "none.json"  # an engine that keeps no stats: no key either
    write_job_manifest(str(none), job_manifest())
    assert "engine_stats" not in stored(none)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda e: e.update(version=2), "engine_stats.version"),
        (lambda e: e["counters"].update(spec_tokens=3), "engine_stats.counters.spec_tokens"),
        (lambda e: e["gauges"].update(gpu_temp={"peak": 1, "mean": 1}), "engine_stats.gauges.gpu_temp"),
        (lambda e: e.update(extra=1), "engine_stats.extra"),
    ],
)
def test_engine_stats_this_version_does_not_know_are_refused(tmp_path: Path, change: Any, named: str) -> None:
    uri = tmp_path / "m.json"
    write_job_manifest(str(uri), job_manifest(engine_stats=TELEMETRY))
    doc = stored(uri)
    change(doc["engine_stats"])
    uri.write_text(json.dumps(doc))
    with pytest.raises(StorageError, match=named.replace(".", r"\.")) as refused:
        read_job_manifest(str(uri))
    assert str(uri) in str(refused.value) and "delete it to rerun the job" in str(refused.value)
