"""The desk's shards endpoint (``GET /api/gates/{dag_id}/{run_id}/shards``) in Airflow's own
api-server app, at the seams of test_app.py: SimpleAuthManager users, HITL rows as Airflow writes
them, real run roots. One run's round 0 ran by lanes (the real lane loop over a pool that finishes
or fails each job, then the real close) and its round 1 is under way; another run's round ran one
task per shard, before lanes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("airflow", reason="needs the airflow extra")
pytestmark = pytest.mark.airflow

from airflow_batchinfer.state.docs.lanes import LaneDoc, LaneShard, read_lane, write_lane  # noqa: E402
from airflow_batchinfer.state.layout import RunLayout  # noqa: E402
from tests.support import desk as t  # noqa: E402
from tests.support.desk import deny_dave  # noqa: E402, F401 (a fixture, used by name)
from tests.support.desk_shards import (  # noqa: E402
    FAILING,
    T0,
    desk,  # noqa: F401 (a fixture, used by name)
)
from tests.support.lane_rounds import BROKEN  # noqa: E402


def shards(desk: t.Desk, run_id: str, user: str = "bob", **params: Any) -> Any:
    return desk.get(user, t.gate_url(run_id, "/shards"), params=params)


def test_a_round_run_by_lanes_page_by_page(desk: t.Desk) -> None:
    seen, cursor = [], None
    for _ in range(5):
        r = shards(desk, "lanes", size=4, **({"cursor": cursor} if cursor else {}))
        assert r.status_code == 200, r.text
        body = r.json()
        assert (body["round"], body["slot"], body["gate_round"], body["rounds"]) == (0, "round-00", 0, [0, 1])
        assert (body["closed"], body["lanes"], body["total"]) == (True, 3, 10)
        assert body["counts"] == {"done": 9, "failed": 1, "unfinished": 0, "unclaimed": 0}
        seen += body["shards"]
        cursor = body["cursor"]
        if cursor is None:
            break
    assert [s["shard_id"] for s in seen] == [f"part-{k:05d}" for k in range(10)]
    layout = RunLayout(desk.roots["lanes"])
    for s in seen:  # each as its lane's document recorded it
        doc = read_lane(layout, 0, s["lane"])
        assert doc is not None
        entry = doc.shard(s["shard_id"])
        assert entry is not None and (s["claimed_at"], s["ended_at"]) == (entry.claimed_at, entry.ended_at)
        assert s["records"] == 3 and s["state"] == ("failed" if s["shard_id"] == FAILING else "done")
    [failed] = [s for s in seen if s["state"] == "failed"]
    assert BROKEN in failed["error"]
    assert (
        failed["quarantine"] == f"{layout.failed(0)}/{FAILING}.json" and Path(failed["quarantine"]).exists()
    )


def test_the_state_filter(desk: t.Desk) -> None:
    body = shards(desk, "lanes", state="failed").json()
    assert [s["shard_id"] for s in body["shards"]] == [FAILING] and body["matching"] == 1
    body = shards(desk, "lanes", state="done", size=500).json()
    assert len(body["shards"]) == 9 and body["cursor"] is None
    body = shards(desk, "lanes", state="unfinished").json()
    assert body["shards"] == [] and body["matching"] == 0 and body["cursor"] is None


def test_a_round_under_way_and_its_next_look(desk: t.Desk, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_batchinfer.review.routes import shards as routes

    monkeypatch.setattr(routes, "SHARDS_TTL_S", 0.0)  # read the lanes' documents on every request
    assert shards(desk, "moving").json()["round"] == 0  # the gate's round, unless asked
    body = shards(desk, "moving", round=1).json()
    assert (body["round"], body["slot"], body["closed"], body["lanes"], body["total"]) == (
        1,
        "round-01",
        False,
        2,
        5,
    )
    assert body["counts"] == {"done": 1, "failed": 0, "unfinished": 2, "unclaimed": 2}
    got = [(s["state"], s["lane"]) for s in body["shards"]]
    assert got == [("done", 0), ("claimed", 1), ("running", 0), ("unclaimed", None), ("unclaimed", None)]
    unfinished = shards(desk, "moving", round=1, state="unfinished").json()["shards"]
    assert [s["state"] for s in unfinished] == ["claimed", "running"]
    # lane 1 records the shard it claimed and ends it
    layout = RunLayout(desk.roots["moving"])
    sid = body["shards"][1]["shard_id"]
    write_lane(layout, LaneDoc(round=1, slot="round-01", lane=1, lanes=2, shards=[
        LaneShard(shard_id=sid, records=3, state="failed", claimed_at=T0 + 1, ended_at=T0 + 2, error="oom"),
    ]))  # fmt: skip
    body = shards(desk, "moving", round=1).json()
    assert body["counts"] == {"done": 1, "failed": 1, "unfinished": 1, "unclaimed": 2}
    assert (body["shards"][1]["state"], body["shards"][1]["error"]) == ("failed", "oom")
    r = shards(desk, "moving", round=2)
    assert r.status_code == 404 and "round 2 has not been planned" in r.json()["detail"]


def test_a_round_no_lane_started_shows_every_shard_unclaimed(desk: t.Desk) -> None:
    body = shards(desk, "before").json()
    assert (body["round"], body["lanes"], body["total"]) == (0, 0, 3)
    assert body["counts"] == {"done": 0, "failed": 0, "unfinished": 0, "unclaimed": 3}
    assert [s["state"] for s in body["shards"]] == ["unclaimed"] * 3


def test_it_is_authorised_like_the_desks_other_endpoints(desk: t.Desk, deny_dave: None) -> None:
    assert desk.get(None, t.gate_url("lanes", "/shards")).status_code == 401
    bad = desk.client.get(t.gate_url("lanes", "/shards"), headers={"Authorization": "Bearer not-a-token"})
    assert bad.status_code in (401, 403)
    r = shards(desk, "lanes", user="dave")
    assert r.status_code == 403 and r.json() == {"detail": "Forbidden"}
    assert shards(desk, "lanes", user="bob").status_code == 200  # a viewer reads
    r = shards(desk, "no_such_run")
    assert r.status_code == 404 and "no such DAG run" in r.json()["detail"]


def test_an_unreadable_lane_document_is_named_with_its_remedy(desk: t.Desk) -> None:
    r = shards(desk, "broken", round=1)
    assert r.status_code == 409, r.text
    detail = r.json()["detail"]
    assert RunLayout(desk.roots["broken"]).lane(1, 1) in detail and "surprise" in detail
    assert "delete it" in detail
    assert shards(desk, "broken", round=0).status_code == 200  # the other rounds still show


@pytest.mark.parametrize(
    "params",
    [{"size": 0}, {"size": 501}, {"cursor": "nonsense"}, {"state": "lost"}, {"round": -1}, {"round": "x"}],
)
def test_bad_input_is_a_400(desk: t.Desk, params: dict[str, Any]) -> None:
    r = shards(desk, "lanes", **params)
    assert r.status_code == 400, (params, r.text)
    assert isinstance(r.json()["detail"], str)
