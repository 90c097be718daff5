"""The calibration desk: a spot-checked run behind the review desk's app (the unit and browser tests of
calibration)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from airflow_batchinfer.state.config import RunConfig
from tests.support import desk as t
from tests.support.desk import desk_app, open_gate
from tests.support.spot_checks import run_slot, spot_run

RUN = "spot"


@dataclass
class CalibrationDesk:
    desk: t.Desk
    cfg: RunConfig

    def url(self, suffix: str = "") -> str:
        return t.gate_url(RUN, suffix)


@pytest.fixture(scope="module")
def calibration_desk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CalibrationDesk]:
    """A run of 600 records whose round 0 closed with about 75 spot checks of the judge's approvals
    (120 asked, of which the judge approved 62%); its gate (``round_01.plan``) waits, nothing decided."""
    cfg = spot_run(tmp_path_factory.mktemp("spot"), n=600, per_shard=200, spot_check_approved=120)
    run_slot(cfg, "round-00")
    with desk_app(tmp_path_factory.mktemp("airflow")) as desk:
        open_gate(desk, RUN, "round_01.plan", cfg.run_root, "Round 1: review the pending records (run)")
        yield CalibrationDesk(desk, cfg)
