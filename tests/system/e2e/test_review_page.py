"""The review desk on a real Airflow 3.3.2 (the e2e ``airflow`` fixture): the api-server loads
the plugin from its entry point, serves the page only with a login, and finds a real gate's run root
and round from what Airflow stored for the plan task. No browser."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from airflow_batchinfer.dev.local_airflow import LocalAirflow
from tests.support.e2e import write_dataset

pytestmark = [pytest.mark.airflow, pytest.mark.slow, pytest.mark.timeout(900)]


def desk(af: LocalAirflow, method: str, path: str, *, token: bool = True, **kwargs: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {af.token()}"} if token else {}
    return httpx.request(method, f"{af.url}/batchinfer{path}", headers=headers, timeout=60, **kwargs)


def test_the_api_server_lists_the_plugin_and_serves_the_page_only_with_a_login(airflow: LocalAirflow):
    [plugin] = [p for p in airflow.api("GET", "/plugins")["plugins"] if p["name"] == "batchinfer"]
    assert plugin["source"].startswith("airflow-batchinfer==")  # the entry point, nothing else
    assert [a["url_prefix"] for a in plugin["fastapi_apps"]] == ["/batchinfer"]
    assert {v["url_route"]: v["destination"] for v in plugin["external_views"]} == {
        "review-desk": "dag_run",
        "batchinfer-review": "nav",
    }
    assert not [e for e in airflow.api("GET", "/plugins/importErrors")["import_errors"]]

    for path in ("/review/", "/review/static/page.js", "/api/gates"):
        assert desk(airflow, "GET", path, token=False).status_code == 401, path
    page = desk(airflow, "GET", "/review/")
    assert page.status_code == 200 and 'src="static/page.js"' in page.text
    cookie = httpx.get(f"{airflow.url}/batchinfer/review/", cookies={"_token": airflow.token()}, timeout=60)
    assert cookie.status_code == 200  # the UI's session cookie, as inside the Airflow UI's iframe
    assert (
        desk(airflow, "GET", "/review/static/page.js").headers["content-type"].startswith("text/javascript")
    )


def test_a_real_gate_is_found_with_its_run_root_and_round(airflow: LocalAirflow, e2e_root: Path):
    data = e2e_root / "desk.jsonl"
    write_dataset(data, 30, prefix="desk-")
    conf = {"input": str(data), "output_root": str(e2e_root / "runs"), "run_name": "desk", "max_rounds": 2}
    root = Path(conf["output_root"]) / "desk"
    run_id = airflow.trigger("e2e_review", conf)
    checked: list[str] = []

    def review(detail: dict[str, Any]) -> str:
        ti = detail["task_instance"]
        gates = desk(airflow, "GET", "/api/gates", params={"dag_id": "e2e_review", "run_id": run_id}).json()
        [gate] = gates["gates"]
        assert (gate["task_id"], gate["map_index"], gate["open"]) == (ti["task_id"], -1, True)
        assert gate["task_id"] == "round_01.plan" and gate["round"] == 0
        assert gate["run_root"] == str(root)  # the plan task's rendered run_root
        assert gate["subject"] == detail["subject"]
        url = f"/api/gates/e2e_review/{run_id}"
        summary = desk(airflow, "GET", f"{url}/summary").json()
        rejected = json.loads((root / "round-00" / "summary.json").read_text())["rejected"]
        assert summary["round"] == 0 and summary["total"] == rejected > 0
        assert desk(airflow, "GET", f"{url}/trend.svg").headers["content-type"].startswith("image/svg+xml")
        page = desk(airflow, "GET", f"{url}/page", params={"size": 200}).json()
        assert len(page["samples"]) == rejected and page["cursor"] is None
        first = page["samples"][0]["id"]
        assert desk(airflow, "GET", f"{url}/sample/{first}").json()["sample"]["id"] == first
        r = desk(airflow, "POST", f"{url}/decisions", json={"action": "drop", "ids": [first], "note": "e2e"})
        assert r.status_code == 201, r.text
        [stored] = [
            json.loads(x) for x in (root / "round-00" / "review" / "decisions.jsonl").read_text().splitlines()
        ]
        assert (stored["action"], stored["ids"], stored["by"]) == ("drop", [first], airflow.username)
        checked.append(ti["task_id"])
        return "Stop"

    state = airflow.wait_run("e2e_review", run_id, timeout_s=600, on_review=review)
    assert checked == ["round_01.plan"]
    assert state == "success"
    r = desk(
        airflow, "POST", f"/api/gates/e2e_review/{run_id}/decisions", json={"action": "drop", "ids": ["x"]}
    )
    assert r.status_code == 409  # the gate was answered: no more decisions
