"""The review desk's web app (airflow_batchinfer/review/app.py and routes/, on the Airflow of
airflow_batchinfer/plugin/desk.py), in process: Airflow's own api-server app (``create_app()``, which
mounts the plugin from its entry point) on a throwaway SQLite database, SimpleAuthManager users,
tokens from ``POST /auth/token``, and real run directories with a closed round. The DAG runs, their
plan tasks' HITL requests and rendered fields are rows written as Airflow writes them; nothing runs."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("airflow", reason="needs the airflow extra")
pytestmark = pytest.mark.airflow

from fastapi.testclient import TestClient  # noqa: E402

from airflow_batchinfer.review.decisions import DecisionLog  # noqa: E402
from airflow_batchinfer.state.layout import RunLayout  # noqa: E402
from airflow_batchinfer.state.owner import RunIdentity  # noqa: E402
from tests.support.desk import (  # noqa: E402
    DAG_ID,
    MARKDOWN_IMAGE,
    PAGE_DIR,
    REJECTED,
    SCRIPT,
    Desk,
    add_gate,
    closed_run,
    deny_dave,  # noqa: F401 (a fixture, used by name)
    gate_url,
)
from tests.support.owners import write_owner  # noqa: E402


@pytest.fixture(scope="module")
def desk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Desk]:
    from tests.support.desk import desk_app  # built on this module's users and DAG

    roots = {
        "open": closed_run(tmp_path_factory.mktemp("open")).run_root,
        "tail": closed_run(tmp_path_factory.mktemp("tail")).run_root,
        "taken": closed_run(tmp_path_factory.mktemp("taken")).run_root,
        "answered": closed_run(tmp_path_factory.mktemp("answered")).run_root,
    }
    with desk_app(tmp_path_factory.mktemp("airflow")) as desk:
        add_gate("open", "round_01.plan", {"run_root": roots["open"], "aws_conn_id": None})
        add_gate("tail", "tail.plan", {"run_root": roots["tail"], "aws_conn_id": None},
                 assignees=[{"id": "carol", "name": "Carol"}])  # fmt: skip
        add_gate("answered", "round_01.plan", {"run_root": roots["answered"]}, answered=True)
        add_gate("taken", "round_01.plan", {"run_root": roots["taken"]})
        for run_id in ("open", "tail", "answered"):  # each run's shard task claimed its root
            write_owner(roots[run_id], RunIdentity(DAG_ID, run_id))
        write_owner(roots["taken"], RunIdentity("some_other_dag", "its_run"))
        add_gate("norender", "round_01.plan", None)
        desk.roots.update(roots)
        yield desk


# --------------------------------------------------------------------------------- the plugin
def test_the_plugin_is_registered_by_its_entry_point_and_lists_its_views(desk: Desk) -> None:
    from importlib.metadata import entry_points

    [ep] = [e for e in entry_points(group="airflow.plugins") if e.name == "batchinfer"]
    assert ep.value == "airflow_batchinfer.plugin:BatchInferPlugin"
    r = desk.get("bob", "/api/v2/plugins")
    assert r.status_code == 200, r.text
    [plugin] = [p for p in r.json()["plugins"] if p["name"] == "batchinfer"]
    assert [a["url_prefix"] for a in plugin["fastapi_apps"]] == ["/batchinfer"]
    views = {v["url_route"]: v for v in plugin["external_views"]}
    assert views["review-desk"]["destination"] == "dag_run"
    assert views["review-desk"]["href"] == "batchinfer/review/?dag_id={DAG_ID}&run_id={RUN_ID}"
    assert views["batchinfer-review"]["category"] == "browse"
    assert views["batchinfer-review"]["href"] == "batchinfer/review/"
    assert desk.get("bob", "/api/v2/plugins/importErrors").json()["import_errors"] == []


def test_importing_the_plugin_builds_no_app() -> None:
    """Task processes import plugins: the module stays light (no FastAPI app, no review modules)."""
    import subprocess
    import sys

    code = (
        "import sys; import airflow_batchinfer.plugin as p; light = {'airflow_batchinfer.review', "
        "'airflow_batchinfer.review.bounds'}; "  # the desk's limits, which the provider info lists
        "print(any(m.startswith('airflow_batchinfer.review') and m not in light for m in sys.modules), "
        "'airflow.api_fastapi.core_api.security' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


# -------------------------------------------------------------------------------- who may see
@pytest.mark.parametrize(
    "path",
    [
        "/batchinfer/review/",
        "/batchinfer/review/static/page.js",
        "/batchinfer/api/gates",
        gate_url("open"),
        gate_url("open", "/page"),
        gate_url("open", "/trend.svg"),
    ],
)
def test_every_endpoint_needs_the_airflow_login(desk: Desk, path: str) -> None:
    r = desk.get(None, path)
    assert r.status_code == 401
    bad = desk.client.get(path, headers={"Authorization": "Bearer not-a-token"})
    assert bad.status_code in (401, 403)


def test_the_ui_cookie_signs_in_and_an_anonymous_page_says_how_to(desk: Desk) -> None:
    with TestClient(desk.client.app, cookies={"_token": desk.tokens["bob"]}) as browser:
        assert browser.get("/batchinfer/review/").status_code == 200
        assert browser.get(gate_url("open", "/summary")).json()["total"] == 20
    r = desk.get(None, "/batchinfer/review/", headers={"Accept": "text/html"})
    assert r.status_code == 401 and r.headers["content-type"].startswith("text/html")
    assert "Not signed in" in r.text
    r = desk.get(None, "/batchinfer/api/gates")
    assert r.status_code == 401 and r.json() == {"detail": "Not authenticated"}


def test_an_anonymous_decision_is_refused(desk: Desk) -> None:
    before = desk.get("alice", gate_url("open", "/decisions")).json()["decisions"]
    r = desk.post(None, gate_url("open", "/decisions"), {"action": "drop", "ids": ["r01"]})
    assert r.status_code == 401
    assert desk.get("alice", gate_url("open", "/decisions")).json()["decisions"] == before


def test_the_page_and_its_assets_are_served_to_a_signed_in_user(desk: Desk) -> None:
    r = desk.get("bob", "/batchinfer/review/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in r.headers["content-security-policy"]
    assert 'src="static/page.js"' in r.text and 'href="static/page.css"' in r.text
    js = desk.get("bob", "/batchinfer/review/static/page.js")
    assert js.status_code == 200 and "javascript" in js.headers["content-type"]
    assert desk.get("bob", "/batchinfer/review/static/page.css").status_code == 200
    assert desk.get("bob", "/batchinfer/review/static/app.py").status_code == 404
    assert desk.get("bob", "/batchinfer/review/static/..%2Fapp.py").status_code == 404


def test_a_user_without_access_to_the_dag_sees_no_gate_and_reads_nothing(desk: Desk, deny_dave: None) -> None:
    assert desk.get("dave", "/batchinfer/api/gates").json()["gates"] == []
    for suffix in ("", "/summary", "/page", "/sample", "/sample/r01", "/decisions", "/trend.svg"):
        r = desk.get("dave", gate_url("open", suffix))
        assert r.status_code == 403, (suffix, r.text)
        assert r.json() == {"detail": "Forbidden"}
    assert (
        desk.post("dave", gate_url("open", "/decisions"), {"action": "drop", "ids": ["r01"]}).status_code
        == 403
    )
    assert desk.get("carol", gate_url("open", "/summary")).status_code == 200  # others still may


def test_a_viewer_reads_but_may_not_decide(desk: Desk) -> None:
    assert desk.get("bob", gate_url("open", "/summary")).status_code == 200
    r = desk.post("bob", gate_url("open", "/decisions"), {"action": "accept", "ids": ["r01"]})
    assert r.status_code == 403
    assert all(d["by"] != "bob" for d in desk.get("bob", gate_url("open", "/decisions")).json()["decisions"])


def test_a_gate_with_assigned_users_takes_decisions_only_from_them(desk: Desk) -> None:
    body = {"action": "retry", "ids": ["r04"], "note": "try again"}
    r = desk.post("alice", gate_url("tail", "/decisions"), body)  # an admin, but not assigned
    assert r.status_code == 403
    assert "alice" in r.json()["detail"] and "assigned users (Carol)" in r.json()["detail"]
    r = desk.post("carol", gate_url("tail", "/decisions"), body)
    assert r.status_code == 201, r.text
    [d] = desk.get("bob", gate_url("tail", "/decisions")).json()["decisions"]
    assert (d["action"], d["by"], list(d["ids"]), d["note"]) == ("retry", "carol", ["r04"], "try again")


# ----------------------------------------------------------------------------------- the gates
def test_lists_the_open_gates_with_their_run_root_and_round(desk: Desk) -> None:
    r = desk.get("bob", "/batchinfer/api/gates")
    assert r.status_code == 200, r.text
    gates = {g["run_id"]: g for g in r.json()["gates"]}
    assert {"open", "tail", "taken"} <= set(gates)
    assert not {"answered", "norender"} & set(gates)  # answered; no rendered run root
    g = gates["open"]
    assert (g["dag_id"], g["task_id"], g["map_index"], g["slot"]) == (DAG_ID, "round_01.plan", -1, "round-01")
    assert g["run_root"] == desk.roots["open"] and g["round"] == 0 and g["open"] is True
    assert g["subject"].startswith("Round 1: review") and g["created_at"]
    assert (
        g["required_actions_path"]
        == f"dags/{DAG_ID}/runs/open/tasks/round_01.plan/required_actions?map_index=-1"
    )
    assert g["assigned_users"] == [] and gates["tail"]["assigned_users"] == [{"id": "carol", "name": "Carol"}]
    assert (gates["tail"]["slot"], gates["tail"]["round"]) == ("tail", 0)  # the last round the plans ran
    assert [g["run_id"] for g in desk.get("bob", "/batchinfer/api/gates?run_id=tail").json()["gates"]] == [
        "tail"
    ]
    assert desk.get("bob", "/batchinfer/api/gates?dag_id=nope").json()["gates"] == []


def test_one_runs_gate(desk: Desk) -> None:
    r = desk.get("bob", gate_url("open"))
    assert r.status_code == 200, r.text
    assert (r.json()["round"], r.json()["run_root"], r.json()["gate"]["open"]) == (
        0,
        desk.roots["open"],
        True,
    )
    answered = desk.get("bob", gate_url("answered")).json()  # still readable once answered
    assert answered["gate"]["open"] is False and answered["round"] == 0


def test_unknown_runs_and_runs_without_a_gate_are_404_and_a_taken_root_409(desk: Desk) -> None:
    r = desk.get("bob", gate_url("no_such_run", "/summary"))
    assert r.status_code == 404 and "no such DAG run" in r.json()["detail"]
    r = desk.get("bob", "/batchinfer/api/gates/no_such_dag/open/page")
    assert r.status_code == 404
    r = desk.get("bob", gate_url("norender", "/summary"))
    assert r.status_code == 409 and "rendered run_root" in r.json()["detail"]
    r = desk.get("bob", gate_url("taken", "/summary"))
    assert r.status_code == 409 and "some_other_dag/its_run" in r.json()["detail"]


def test_the_run_root_comes_from_airflow_never_from_the_request(desk: Desk, tmp_path: Path) -> None:
    other = closed_run(tmp_path)  # a run root the request names: it must not be read
    Path(RunLayout(other.run_root).rejected_dir(0), "part-00000.jsonl.zst").unlink()
    for params in ({"run_root": other.run_root}, {"root": other.run_root, "so": "{}"}):
        r = desk.get("bob", gate_url("open", "/summary"), params=params)
        assert r.status_code == 200 and r.json()["total"] == 20
        r = desk.get("bob", gate_url("open", "/page"), params={**params, "size": 200})
        assert len(r.json()["samples"]) == 20
    r = desk.post("alice", gate_url("open", "/decisions"),
                  {"action": "drop", "ids": ["r01"], "run_root": other.run_root})  # fmt: skip
    assert r.status_code == 400  # unknown fields are refused
    assert not Path(RunLayout(other.run_root).round(0), "review").exists()


# -------------------------------------------------------------------------------- the data
def test_summary_counts_groups_and_trend(desk: Desk) -> None:
    r = desk.get("bob", gate_url("open", "/summary"))
    assert r.status_code == 200, r.text
    s = r.json()
    assert (s["round"], s["total"], s["counts"]["approved"], s["counts"]["rejected"]) == (0, 20, 10, 20)
    assert s["groups"] == [
        {"group": "too short: # chars", "count": 10},
        {"group": "wrong answer", "count": 10},
    ]
    [t] = s["trend"]
    assert (t["round"], t["pending"], t["approved"]) == (0, 30, 10)
    svg = desk.get("bob", gate_url("open", "/trend.svg"))
    assert svg.status_code == 200 and svg.headers["content-type"].startswith("image/svg+xml")
    assert svg.text.lstrip().startswith("<svg") and "<script" not in svg.text


def test_pages_follow_their_cursors_and_filters(desk: Desk) -> None:
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        r = desk.get(
            "bob", gate_url("open", "/page"), params={"size": 7, **({"cursor": cursor} if cursor else {})}
        )
        assert r.status_code == 200, r.text
        page = r.json()
        seen += [s["id"] for s in page["samples"]]
        cursor = page["cursor"]
        if cursor is None:
            break
    assert seen == REJECTED and page["total"] == 20
    r = desk.get("bob", gate_url("open", "/page"), params={"group": "wrong answer", "size": 200})
    assert [s["id"] for s in r.json()["samples"]] == [i for i in REJECTED if int(i[1:]) % 2]
    r = desk.get("bob", gate_url("open", "/page"), params={"text": "ALERT", "size": 200})
    assert [s["id"] for s in r.json()["samples"]] == ["r01"]


def test_samples_are_seeded_and_one_is_found_by_id(desk: Desk) -> None:
    a = desk.get("bob", gate_url("open", "/sample"), params={"n": 5, "seed": 7}).json()
    b = desk.get("bob", gate_url("open", "/sample"), params={"n": 5, "seed": 7}).json()
    assert [s["id"] for s in a["samples"]] == [s["id"] for s in b["samples"]]
    assert len(a["samples"]) == 5 and set(s["id"] for s in a["samples"]) <= set(REJECTED)
    s = desk.get("bob", gate_url("open", "/sample/r04")).json()["sample"]
    assert (s["id"], s["reason"], s["score"], s["attempts"], s["approved"]) == ("r04", "too short: 4 chars",
                                                                             0.04, 1, False)  # fmt: skip
    assert s["output"] == "answer 4" and s["prompt"] == "q r04"
    r = desk.get("bob", gate_url("open", "/sample/r03"))  # approved: not among the rejected rows
    assert r.status_code == 404 and "r03" in r.json()["detail"]


def test_model_output_is_plain_json_text(desk: Desk) -> None:
    s = desk.get("bob", gate_url("open", "/sample/r01"))
    assert s.headers["content-type"] == "application/json"
    assert s.json()["sample"]["output"] == SCRIPT
    assert desk.get("bob", gate_url("open", "/sample/r02")).json()["sample"]["output"] == MARKDOWN_IMAGE
    html = desk.get("bob", "/batchinfer/review/").text
    assert "alert(1)" not in html and "evil.example" not in html


def test_the_page_script_never_parses_data_as_html() -> None:
    """Every text from storage goes in as a text node: no HTML sink, no markdown, no eval."""
    js = (PAGE_DIR / "page.js").read_text()
    code = re.sub(r"^\s*//.*$", "", js, flags=re.M)  # the comments may name what is forbidden
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                 "DOMParser", "createContextualFragment", "srcdoc", "marked", "markdown"):  # fmt: skip
        assert sink not in code, sink
    assert "createTextNode" in code and "textContent" in code
    assert 'credentials: "same-origin"' in code
    for text in (PAGE_DIR / "index.html").read_text(), js, (PAGE_DIR / "page.css").read_text():
        assert "http://" not in text.replace("http://evil", "") and "https://" not in text  # nothing fetched
        assert not re.search(r"""(src|href)=["']/""", text)  # relative URLs only


def test_bad_input_is_a_400(desk: Desk) -> None:
    for suffix, params in [
        ("/page", {"size": 201}),
        ("/page", {"size": 0}),
        ("/page", {"cursor": "nonsense"}),
        ("/sample", {"n": 500}),
        ("/summary", {"round": -1}),
        ("/page", {"round": "x"}),
    ]:
        r = desk.get("bob", gate_url("open", suffix), params=params)
        assert r.status_code == 400, (suffix, params, r.text)
        assert isinstance(r.json()["detail"], str)
    r = desk.get("bob", gate_url("open", "/summary"), params={"round": 1})
    assert r.status_code == 404  # the gate reviews round 0; round 1 has not closed
    for body in [
        {"action": "nuke", "ids": ["r01"]},
        {"action": "drop"},
        {"action": "drop", "ids": []},
        {"action": "drop", "ids": ["r01"], "filter": {"group": "wrong answer"}},
        {"action": "drop", "filter": {"group": "x", "shell": "rm"}},
        {"action": "drop", "ids": ["r01"], "note": "x" * 5000},
        "not an object",
    ]:
        r = desk.post("alice", gate_url("open", "/decisions"), body)
        assert r.status_code == 400, (body, r.text)
    r = desk.post("alice", gate_url("open", "/decisions"), {"action": "drop", "ids": ["r01"], "round": 1})
    assert r.status_code == 409 and "reload" in r.json()["detail"]


def test_decisions_round_trip(desk: Desk) -> None:
    url = gate_url("open", "/decisions")
    r = desk.post("alice", url, {"action": "drop", "ids": ["r01", "r02"], "note": "unsafe output"})
    assert r.status_code == 201, r.text
    assert r.json()["round"] == 0 and r.json()["decisions"] == 1
    r = desk.post("carol", url, {"action": "accept", "filter": {"group": "too short: # chars"}})
    assert r.status_code == 201, r.text
    got = desk.get("bob", url).json()
    first, second = got["decisions"]
    assert (first["action"], first["by"], first["ids"]) == ("drop", "alice", ["r01", "r02"])
    assert first["note"] == "unsafe output"
    assert first["round"] == 0 and re.match(r"\d{4}-\d\d-\d\dT", first["at"])
    assert (second["action"], second["by"], second["filter"]) == (
        "accept",
        "carol",
        {"group": "too short: # chars"},
    )
    assert got["open"] is True and got["tally"]


def test_decisions_are_closed_once_the_gate_is_answered(desk: Desk) -> None:
    r = desk.post("alice", gate_url("answered", "/decisions"), {"action": "drop", "ids": ["r01"]})
    assert r.status_code == 409 and "no review gate is open" in r.json()["detail"]
    assert desk.get("bob", gate_url("answered", "/decisions")).json()["open"] is False


def test_a_decision_after_the_run_applied_the_round_is_refused_not_lost(desk: Desk) -> None:
    """The gate still reads as open in Airflow, but the answer's plan task has sealed the log (it
    is applying the decisions): the decision is refused (409), never recorded and ignored."""
    log = DecisionLog(desk.roots["open"], 0)
    path = Path(log.uri)
    before = path.read_bytes() if path.exists() else None
    try:
        applied = log.seal()
        r = desk.post("alice", gate_url("open", "/decisions"), {"action": "drop", "ids": ["r01"]})
        assert r.status_code == 409 and "was not recorded" in r.json()["detail"], r.text
        assert log.read() == applied
    finally:
        if before is None:
            path.unlink()
        else:
            path.write_bytes(before)


def test_storage_options_come_from_the_plan_tasks_rendered_connection(
    desk: Desk, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_batchinfer.hooks import aws
    from airflow_batchinfer.plugin import desk as airflow_desk

    calls: list[str | None] = []

    def options(conn_id: str | None) -> dict[str, Any]:
        calls.append(conn_id)
        return {}

    monkeypatch.setattr(aws, "storage_options_from_aws_conn", options)
    monkeypatch.setattr(airflow_desk, "_so_cache", {})
    root = closed_run(tmp_path).run_root
    add_gate("conn", "round_01.plan", {"run_root": root, "aws_conn_id": "team_s3"})
    write_owner(root, RunIdentity(DAG_ID, "conn"))
    r = desk.get("bob", gate_url("conn", "/summary"), params={"aws_conn_id": "aws_default"})
    assert r.status_code == 200 and r.json()["total"] == 20
    assert calls == ["team_s3"]  # once: then reused for a while


def test_a_run_root_no_dag_run_claimed_is_not_shown(desk: Desk, tmp_path: Path) -> None:
    """Every run root a DAG run works in names it (owner.json): a rendered root without one is not
    this run's (409), whatever the page asks."""
    add_gate("unclaimed", "round_01.plan", {"run_root": closed_run(tmp_path).run_root})
    r = desk.get("bob", gate_url("unclaimed", "/summary"))
    assert r.status_code == 409 and "no owner.json" in r.json()["detail"]
