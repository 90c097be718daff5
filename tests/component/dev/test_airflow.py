"""DevAirflow's REST client against a stand-in api-server on 127.0.0.1 (a real HTTP server that
answers like Airflow 3.3.2's, including its 500 for a database error)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.dev import airflow as dev_airflow
from airflow_batchinfer.dev.airflow import DB_ERROR_TRIES, AirflowApiError, DevAirflow
from airflow_batchinfer.exceptions import BatchInferError

DB_ERROR = {"detail": {"reason": "Database error", "message": "Serious error ... look for ID abc"}}


class StandIn:
    """Answers /auth/token, and each POST with the next of ``answers`` (status, body); 200 echoes."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, dict[str, Any]]] = []
        self.posts: list[dict[str, Any]] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                if self.path == "/auth/token":
                    self.reply(201, {"access_token": "t"})
                    return
                stand_in.posts.append(body)
                status, answer = stand_in.answers.pop(0) if stand_in.answers else (200, body)
                self.reply(status, answer)

            def reply(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])


@pytest.fixture
def stand_in() -> Iterator[StandIn]:
    s = StandIn()
    yield s
    s.server.shutdown()
    s.server.server_close()


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The client's waits between tries, recorded instead of slept."""
    out: list[float] = []
    monkeypatch.setattr(dev_airflow.time, "sleep", out.append)
    return out


@pytest.fixture
def af(stand_in: StandIn, tmp_path: Path, waits: list[float]) -> DevAirflow:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "api-server.log").write_text(
        "x" * 9000 + "sqlite3.OperationalError: database is locked\n"
    )
    return DevAirflow(home=tmp_path, dags_folder=tmp_path, port=stand_in.port)


def test_a_trigger_that_met_a_database_error_is_sent_again_with_the_same_run_id(
    af: DevAirflow, stand_in: StandIn, waits: list[float]
) -> None:
    stand_in.answers = [(500, DB_ERROR), (500, DB_ERROR)]
    run_id = af.trigger("d", {"k": 1})
    assert len(stand_in.posts) == 3 and waits == [1, 2]
    assert {p["dag_run_id"] for p in stand_in.posts} == {run_id}
    assert run_id.startswith("manual__") and stand_in.posts[-1]["conf"] == {"k": 1}


def test_a_trigger_whose_first_try_started_the_run_is_not_an_error(af: DevAirflow, stand_in: StandIn) -> None:
    # the first try committed, then its answer failed: the second finds its own run id taken
    stand_in.answers = [(500, DB_ERROR), (409, {"detail": "exists"})]
    run_id = af.trigger("d")
    assert [p["dag_run_id"] for p in stand_in.posts] == [run_id, run_id]


def test_database_errors_end_in_an_error_that_quotes_the_api_server_log(
    af: DevAirflow, stand_in: StandIn, waits: list[float]
) -> None:
    stand_in.answers = [(500, DB_ERROR)] * DB_ERROR_TRIES
    with pytest.raises(
        AirflowApiError, match=r"(?s)Database error.*api-server\.log:\nx+sqlite3.*is locked"
    ) as err:
        af.trigger("d")
    assert err.value.status == 500 and len(str(err.value).split("api-server.log:\n")[1]) == 4000
    assert len(stand_in.posts) == DB_ERROR_TRIES and waits == [1, 2, 3]


def test_other_errors_are_not_sent_again(af: DevAirflow, stand_in: StandIn, waits: list[float]) -> None:
    stand_in.answers = [(409, {"detail": "exists"}), (500, {"detail": "boom"})]
    with pytest.raises(AirflowApiError, match="409") as err:
        af.trigger("d", run_id="r")  # the caller's run id: a duplicate is the caller's error
    assert err.value.status == 409 and "api-server.log" not in str(err.value)
    assert isinstance(err.value, BatchInferError)  # in the package's exception tree
    with pytest.raises(AirflowApiError, match="boom"):
        af.trigger("d", run_id="r")
    assert len(stand_in.posts) == 2 and waits == []


def test_sqlite_writers_wait_for_the_lock(tmp_path: Path) -> None:
    """Four processes write one SQLite file: the URL asks sqlite3 to wait 60 s for its lock."""
    create_engine = pytest.importorskip("sqlalchemy", reason="needs the airflow extra").create_engine
    url = DevAirflow(home=tmp_path, dags_folder=tmp_path).environ()["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
    engine = create_engine(url)
    assert engine.dialect.create_connect_args(engine.url)[1]["timeout"] == 60
