"""The lowest versions the provider claims (pyproject.toml's extras) are the versions tested.

``make test-floor`` runs this file in ``.cache/floor-venv``, built from ``constraints-floor.txt``
(Airflow and the standard, amazon, cncf.kubernetes and celery providers at their declared floors),
with ``BATCHINFER_FLOOR`` naming that file: the tests then first prove that they run on exactly those
versions. In the normal suite (Airflow 3.3.2) the same tests run on the e2e Airflow: one small
run more, and the check that the floor file and the declared floors agree.
"""

from __future__ import annotations

import json
import os
import tomllib
import warnings
from collections import Counter
from datetime import timedelta
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from airflow_batchinfer.dev.local_airflow import LocalAirflow
from airflow_batchinfer.run.plan import ACCEPT
from airflow_batchinfer.storage import JsonlDir
from tests.support.e2e import write_dataset

pytestmark = [pytest.mark.airflow, pytest.mark.slow, pytest.mark.timeout(600)]
REPO = Path(__file__).resolve().parents[3]
FLOOR_FILE = REPO / "constraints-floor.txt"
# the distributions whose lowest versions are claimed, and the extra that claims each
FLOORED = {
    "apache-airflow": "airflow",
    "apache-airflow-providers-standard": "airflow",
    "apache-airflow-providers-amazon": "aws",
    "apache-airflow-providers-cncf-kubernetes": "cncf",
    "apache-airflow-providers-celery": "celery",
}
ON_FLOOR = os.environ.get("BATCHINFER_FLOOR")  # set by `make test-floor`: the constraints file used


def declared_floors() -> dict[str, Version]:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    floors: dict[str, Version] = {}
    for name, extra in FLOORED.items():
        [req] = [Requirement(r) for r in extras[extra] if Requirement(r).name == name]
        [low] = [Version(s.version) for s in req.specifier if s.operator == ">="]
        floors[name] = low
    return floors


def pinned(path: Path) -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in path.read_text().splitlines():
        if "==" in line and not line.lstrip().startswith("#"):
            name, _, ver = line.partition("==")
            pins[name.strip().lower().replace("_", "-")] = Version(ver.strip())
    return pins


def test_the_floor_file_pins_the_declared_floors() -> None:
    pins = pinned(FLOOR_FILE)
    assert {name: pins.get(name) for name in FLOORED} == declared_floors()


@pytest.mark.skipif(not ON_FLOOR, reason="only under `make test-floor` (BATCHINFER_FLOOR)")
def test_this_environment_is_the_floor() -> None:
    import airflow

    pins = pinned(Path(str(ON_FLOOR)))
    assert Version(airflow.__version__) == pins["apache-airflow"] == declared_floors()["apache-airflow"]
    assert {name: Version(version(name)) for name in FLOORED} == {name: pins[name] for name in FLOORED}


def test_the_providers_work_beside_this_airflow(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the package uses of each provider: the amazon hook's S3 options (no fallback to the plain
    connection), the Kubernetes hook's client, the Celery executor, the HITL gate's timeout."""
    monkeypatch.setenv("AIRFLOW_CONN_FLOOR_AWS", json.dumps({
        "conn_type": "aws", "login": "AKID", "password": "SECRET",
        "extra": {"endpoint_url": "http://127.0.0.1:9", "region_name": "eu-west-1"},
    }))  # fmt: skip
    kubeconfig = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:9"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
    }  # fmt: skip
    monkeypatch.setenv("AIRFLOW_CONN_FLOOR_K8S", json.dumps({
        "conn_type": "kubernetes", "extra": {"kube_config": json.dumps(kubeconfig)},
    }))  # fmt: skip
    with warnings.catch_warnings():  # an older provider's deprecation warnings are no failure here
        warnings.simplefilter("ignore")
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook  # noqa: F401 - no fallback
        from airflow.providers.celery.executors.celery_executor import CeleryExecutor  # noqa: F401
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook  # noqa: F401
        from airflow.providers_manager import ProvidersManager

        from airflow_batchinfer.hooks.aws import storage_options_from_aws_conn
        from airflow_batchinfer.hooks.pool import _kubernetes_api
        from airflow_batchinfer.operators.rounds import RoundControllerOperator

        assert storage_options_from_aws_conn("floor_aws") == {
            "key": "AKID", "secret": "SECRET", "endpoint_url": "http://127.0.0.1:9",
            "client_kwargs": {"region_name": "eu-west-1"},
        }  # fmt: skip
        assert _kubernetes_api("floor_k8s").configuration.host == "https://127.0.0.1:9"
        hooks = ProvidersManager().hooks
        assert all(hooks[conn_type] is not None for conn_type in ("aws", "kubernetes", "batchinfer_pool"))
        gate = RoundControllerOperator(
            task_id="plan", slot="round-01", run_root="/tmp/x", response_timeout=timedelta(hours=2)
        )
        assert gate.response_timeout == timedelta(hours=2)


def test_the_review_desk_is_served_only_where_airflow_has_what_it_needs(airflow: LocalAirflow) -> None:
    """On an Airflow older than the desk needs: no tab, no Browse entry, no desk under /batchinfer
    (the UI's own page answers there), and the api-server's log says which Airflow the desk needs."""
    import httpx

    from airflow_batchinfer.compat import REVIEW_DESK_AIRFLOW, review_desk_unavailable

    [plugin] = [p for p in airflow.api("GET", "/plugins")["plugins"] if p["name"] == "batchinfer"]
    page = httpx.get(f"{airflow.url}/batchinfer/review/", cookies={"_token": airflow.token()}, timeout=60)
    if review_desk_unavailable() is None:
        assert {v["url_route"] for v in plugin["external_views"]} == {"review-desk", "batchinfer-review"}
        assert page.status_code == 200 and "<title>Review desk</title>" in page.text
    else:
        assert plugin["external_views"] == [] and plugin["fastapi_apps"] == []
        assert "<title>Review desk</title>" not in page.text
        log = airflow.log("api-server").read_text(errors="replace")
        assert f"the review desk needs Airflow {REVIEW_DESK_AIRFLOW} or later" in log


def test_the_dags_import_and_a_small_reviewed_run_keeps_every_id(
    airflow: LocalAirflow, e2e_root: Path
) -> None:
    """The example DAGs import here; the e2e DAGs imported in the real dag-processor (the e2e
    ``airflow`` fixture waits for them, raising their import errors); one run of two shards on the
    SIMULATED engine and the local pool, its review gate (the standard provider's HITL operator)
    answered through the REST API: success, every id exactly once in the results, and the DAG's
    results asset updated."""
    with warnings.catch_warnings():  # as the dag-processor parses: a warning is no import error
        warnings.simplefilter("ignore")  # (Airflow 3.1's own modules import its deprecated paths)
        try:
            from airflow.dag_processing.dagbag import DagBag
        except ImportError:  # Airflow 3.1
            from airflow.models.dagbag import DagBag  # type: ignore[no-redef]

        bag = DagBag(dag_folder=str(REPO / "dags"))  # no examples: tests/conftest.py
    assert bag.import_errors == {} and len(bag.dags) == 4
    assert airflow.api("GET", "/importErrors")["import_errors"] == []

    data = e2e_root / "floor.jsonl"
    ids = write_dataset(data, 20, prefix="floor-")
    conf: dict[str, Any] = {
        "input": str(data), "output_root": str(e2e_root / "runs"), "run_name": "floor", "max_rounds": 2,
        "preflight_records": 0,
    }  # fmt: skip
    gates: list[str] = []

    def accept(detail: dict[str, Any]) -> str:
        gates.append(detail["task_instance"]["task_id"])
        return ACCEPT

    run_id = airflow.trigger("e2e_review", conf)
    state = airflow.wait_run("e2e_review", run_id, timeout_s=480, on_review=accept)
    root = e2e_root / "runs" / "floor"
    report = json.loads((root / "report" / "summary.json").read_text())
    assert state == "success", report
    assert gates == ["round_01.plan"] and report["status"] == "accepted_by_review"
    assert report["invariant"]["ok"], report["invariant"]
    results = [r for f in JsonlDir(str(root / "results")).jsonl_files() for r in f.iter_records()]
    counts = Counter(r["id"] for r in results)
    assert sorted(counts) == sorted(ids) and set(counts.values()) == {1}  # nothing lost, nothing doubled
    assert 0 < report["approved"] < len(ids) == report["approved"] + report["accepted_by_review"]
    # the run updated its DAG's results asset, the counts in the event's extra
    params = {"source_dag_id": "e2e_review", "source_run_id": run_id}
    [event] = airflow.api("GET", "/assets/events", params=params)["asset_events"]
    assert event["uri"] == "x-batchinfer://e2e_review/results", event
    extra = event["extra"]
    assert (extra["results"], extra["status"]) == (str(root / "results"), "accepted_by_review"), extra
    assert extra["approved"] + extra["accepted_by_review"] == len(ids) and extra["accepted_by_review"] > 0
