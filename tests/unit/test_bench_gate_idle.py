"""bench/gate_idle.py's parts that are computed, not measured: the settings it needs and the side by
side table of keep vs release."""

from __future__ import annotations

from bench.gate_idle import COLUMNS, missing_settings, side_by_side


def test_a_tree_without_the_gate_settings_is_named() -> None:
    assert missing_settings({"gate_idle"}) == ["gate_keep_warm_s"]
    assert missing_settings({"gate_idle", "gate_keep_warm_s", "review"}) == []


def test_the_table_has_a_column_per_policy_and_a_row_per_figure() -> None:
    keep = {"wall_s": 61.0, "idle_gates_gpu_s": 40.0, "rewarm_s": 0.0, "ids_once": True}
    release = {"wall_s": 66.5, "idle_gates_gpu_s": 6.0, "rewarm_s": 4.2, "ids_once": True}
    lines = side_by_side({"keep": keep, "release": release})
    assert lines[0].split() == ["keep", "release"]
    assert len(lines) == 1 + len(COLUMNS)
    gate = next(line for line in lines if line.startswith("idle at gates"))
    assert gate.split()[-2:] == ["40.0", "6.0"]
    leased = next(line for line in lines if line.startswith("leased GPU-s"))
    assert leased.split()[-2:] == ["–", "–"]  # not measured: shown as unknown, not 0
