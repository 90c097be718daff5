"""What differs between the supported Airflow versions: the exceptions' home, and the review desk
that needs Airflow 3.3 (off, and saying so, on an older one)."""

from __future__ import annotations

import importlib
import logging

import pytest

pytest.importorskip("airflow", reason="needs the airflow extra")
pytestmark = pytest.mark.airflow


def test_the_exceptions_are_the_ones_airflow_raises() -> None:
    from airflow import exceptions as core
    from airflow.sdk import exceptions as sdk

    from airflow_batchinfer.compat import AirflowFailException, AirflowNotFoundException

    # task SDK 1.2+ (Airflow 3.2+) has them; on 3.1 they are Airflow core's
    for name, ours in (
        ("AirflowFailException", AirflowFailException),
        ("AirflowNotFoundException", AirflowNotFoundException),
    ):
        assert ours is (getattr(sdk, name) if hasattr(sdk, name) else getattr(core, name)), name


@pytest.mark.parametrize(
    ("version", "off"),
    [
        ("3.1.0", True),
        ("3.2.2", True),
        ("3.3.0rc1", False),
        ("3.3", False),
        ("3.3.0", False),
        ("4.0.0", False),
    ],
)
def test_the_review_desk_needs_airflow_3_3(version: str, off: bool) -> None:
    from airflow_batchinfer.compat import review_desk_unavailable

    reason = review_desk_unavailable(version)
    assert (reason is not None) == off
    if reason:
        assert f"needs Airflow 3.3.0 or later and this is Airflow {version}" in reason
        assert "Required Actions" in reason


def test_on_an_older_airflow_the_plugin_shows_no_tab_and_serves_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import airflow_batchinfer.plugin as plugin

    monkeypatch.setattr("airflow_batchinfer.compat.airflow_version", lambda: "3.2.0")
    try:
        old = importlib.reload(plugin)
        assert old.BatchInferPlugin.external_views == []
        with caplog.at_level(logging.WARNING, logger="airflow_batchinfer.plugin"):
            assert old.BatchInferPlugin().fastapi_apps == []
        assert "the review desk needs Airflow 3.3.0 or later and this is Airflow 3.2.0" in caplog.text
    finally:
        monkeypatch.undo()
        importlib.reload(plugin)
    served = {v["url_route"] for v in plugin.BatchInferPlugin.external_views}  # this Airflow's again
    assert served == (set() if plugin.UNAVAILABLE else {"review-desk", "batchinfer-review"})
