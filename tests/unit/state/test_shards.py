"""Shard references (storage.shard_ref) and a plan's shards (state.shards): parsed once from their
stored form and written back to exactly the same bytes, in plans, manifests and XCom alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from airflow_batchinfer.state.docs import Plan, read_plan, write_plan
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.state.shards import PlannedShard
from airflow_batchinfer.storage import JsonlDir
from airflow_batchinfer.storage.digest import IdDigest
from airflow_batchinfer.storage.manifest import OutputManifest, read_manifest, write_manifest
from airflow_batchinfer.storage.shard_ref import RangeRef, ShardRef, parse_ref

SUM = "0f" * 16
SHARDED = {"shard_id": "part-00000", "uri": "/run/input/part-00000.jsonl.zst", "records": 1000,
           "ids": {"count": 1000, "sum": SUM}}  # fmt: skip
RECOMPACTED = {"shard_id": "part-00003", "uri": "/run/round-01/pending/part-00003.jsonl.zst", "records": 7}
PLAIN_RANGE = {"shard_id": "part-00001", "uri": "/data/in.jsonl", "records": 11, "range": [364, 1112],
               "bytes": 748, "version": "1369:1796626563.2008977", "estimated": True,
               "max_line_bytes": 16777216, "max_id_bytes": 512}  # fmt: skip
ZSTD_FANNED = {"shard_id": "part-00002", "uri": "/data/in.jsonl.zst", "records": 12, "range": [900, 1800],
               "bytes": 900, "version": "1800:x", "estimated": True, "lead_in": [0, 900],
               "max_line_bytes": 16777216, "max_id_bytes": 512, "fan_out": ["base", "sql"]}  # fmt: skip
# a range in input/_manifest.json once round 0's close read it: its records, ids and lines as read
READ_RANGE = {"shard_id": "part-00001", "uri": "/data/in.jsonl", "records": 10,
              "ids": {"count": 10, "sum": SUM}, "range": [364, 1112], "bytes": 748,
              "version": "1369:1796626563.2008977", "estimated": True,
              "max_line_bytes": 16777216, "max_id_bytes": 512,
              "read": {"lines": 12, "records": 10, "blank": 1, "skipped": 0, "quarantined": 1}}  # fmt: skip
REFS = [SHARDED, RECOMPACTED, PLAIN_RANGE, ZSTD_FANNED, READ_RANGE]


@pytest.mark.parametrize("stored", REFS, ids=["sharded", "recompacted", "range", "zstd-fanned", "read"])
def test_a_ref_reads_and_writes_back_its_stored_form_byte_for_byte(stored: dict[str, Any]) -> None:
    ref = parse_ref(stored)
    assert isinstance(ref, RangeRef if "range" in stored else ShardRef)
    assert json.dumps(ref.to_json()) == json.dumps(stored)  # keys, values and their order
    assert parse_ref(json.loads(json.dumps(ref.to_json()))) == ref


def test_a_range_ref_gives_what_its_readers_compute() -> None:
    ref = parse_ref(ZSTD_FANNED)
    assert isinstance(ref, RangeRef) and ref.is_range
    assert (ref.start, ref.end, ref.span) == (900, 1800, 900) and ref.lead_in == (0, 900)
    assert ref.fanned is not None and ref.fanned.arms == ("base", "sql")
    shard = parse_ref(SHARDED)
    assert not shard.is_range and shard.ids == IdDigest(1000, int(SUM, 16))


def test_unknown_keys_and_a_plans_keys_are_refused_in_a_ref() -> None:
    for bad in (
        {**SHARDED, "colour": "red"},
        {**SHARDED, "spot_check_rate": 0.1},
        {**PLAIN_RANGE, "slot": "x"},
    ):
        with pytest.raises(ValidationError):
            parse_ref(bad)
    with pytest.raises(ValidationError):
        parse_ref({**SHARDED, "ids": {"count": 1}})  # not an id digest
    with pytest.raises(ValidationError):
        PlannedShard.of({**SHARDED, "colour": "red"})


def test_a_ref_is_immutable_and_holds_its_own_digest() -> None:
    digest = IdDigest.of(["a", "b"])
    ref = ShardRef(shard_id="part-00000", uri="/x", records=2, ids=digest)
    digest.add("c")  # the writer's digest goes on adding: the ref's does not move
    assert ref.ids == IdDigest.of(["a", "b"])
    with pytest.raises(ValidationError):
        ref.records = 3  # type: ignore[misc]


# A plan's shards: the ref's keys and the plan's side by side, ``spot_check_rate`` after ``estimated``
PLANNED_RANGE = {"shard_id": "part-00002", "uri": "/data/in.jsonl.zst", "records": 12, "range": [900, 1800],
                 "bytes": 900, "version": "1800:x", "estimated": True, "spot_check_rate": 0.25,
                 "lead_in": [0, 900], "max_line_bytes": 16777216, "max_id_bytes": 512,
                 "fan_out": ["base", "sql"]}  # fmt: skip
PLANNED_FILE = {**SHARDED, "spot_check_rate": 0.1, "round": 2, "slot": "round-02"}
PLANNED = [SHARDED, RECOMPACTED, PLAIN_RANGE, PLANNED_RANGE, PLANNED_FILE]


@pytest.mark.parametrize(
    "stored", PLANNED, ids=["sharded", "recompacted", "range", "spot-checked-range", "file"]
)
def test_a_planned_shard_reads_and_writes_back_its_stored_form_byte_for_byte(stored: dict[str, Any]) -> None:
    planned = PlannedShard.of(stored)
    assert planned.ref == parse_ref(
        {k: v for k, v in stored.items() if k not in ("spot_check_rate", "round", "slot")}
    )
    assert json.dumps(planned.to_json()) == json.dumps(stored)
    assert (planned.shard_id, planned.uri, planned.records) == (
        stored["shard_id"],
        stored["uri"],
        stored["records"],
    )
    assert (planned.range_ref is not None) == ("range" in stored)


def test_a_plans_shards_updates_are_copies() -> None:
    planned = PlannedShard.of(PLAIN_RANGE)
    checked = planned.with_spot_check(0.5)
    assert planned.spot_check_rate is None and checked.spot_check_rate == 0.5
    assert list(checked.to_json()) == [*list(PLAIN_RANGE)[:7], "spot_check_rate", *list(PLAIN_RANGE)[7:]]
    moved = checked.with_ref(checked.ref.model_copy(update={"uri": "/elsewhere"}))
    assert moved.uri == "/elsewhere" and moved.spot_check_rate == 0.5 and checked.uri == PLAIN_RANGE["uri"]


def test_plan_json_holds_its_shards_as_they_were_stored(tmp_path: Path) -> None:
    layout = RunLayout(str(tmp_path / "run"))
    plan = Plan.model_validate({"slot": "round-00", "round": 0, "mode": "rounds", "shards": PLANNED})
    write_plan(layout, plan)
    text = (tmp_path / "run" / "round-00" / "plan.json").read_text()
    assert json.dumps(json.loads(text)["shards"]) == json.dumps(PLANNED)  # keys in the same order
    again = read_plan(layout, "round-00")
    assert (
        again is not None
        and again.encode() == plan.encode()
        and again.records == sum(s["records"] for s in PLANNED)
    )
    assert all(isinstance(s, PlannedShard) for s in again.shards)


def test_a_manifest_holds_its_refs_as_they_were_stored(tmp_path: Path) -> None:
    out = JsonlDir(str(tmp_path / "input"))
    manifest = OutputManifest.model_validate(
        {"kind": "ranges", "state": "complete", "shards": [PLAIN_RANGE, READ_RANGE]}
    )
    write_manifest(out, manifest)
    stored = json.loads((tmp_path / "input" / "_manifest.json").read_text())
    assert [json.dumps(s) for s in stored["shards"]] == [json.dumps(PLAIN_RANGE), json.dumps(READ_RANGE)]
    back = read_manifest(out)
    assert back is not None and back.shards == manifest.shards and back.ranges() == manifest.shards


def test_a_manifest_where_round_zeros_close_copied_a_plans_keys_still_reads(tmp_path: Path) -> None:
    """Round 0's close once wrote a range's plan keys into the input's manifest: read, they are left out."""
    out = JsonlDir(str(tmp_path / "input"))
    (tmp_path / "input").mkdir()
    shards = [{**PLAIN_RANGE, "spot_check_rate": 0.1}]
    doc = {"schema_version": 2, "kind": "ranges", "state": "complete", "shards": shards}
    (tmp_path / "input" / "_manifest.json").write_text(json.dumps(doc))
    back = read_manifest(out)
    assert back is not None and [s.to_json() for s in back.shards] == [PLAIN_RANGE]
