"""Issue 38, items 1 and 6: Parquet parts planned from their footers alone (whole row groups, small
files grouped, a file without rows contributing nothing) and read in place; a corrupt footer refuses
the plan, a corrupt row group fails its shard, a bad row names its part, row group and row."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow_batchinfer.exceptions import ConfigError, CorruptFileError
from airflow_batchinfer.storage.input_parts import list_input
from airflow_batchinfer.storage.part_plan import size_input
from airflow_batchinfer.storage.ranges import read_range
from airflow_batchinfer.storage.shard_ref import RangeRef
from tests.support.frames import Sink
from tests.support.parts import parquet_part, pieces_of, plan_input, read_shards

pytest.importorskip("pyarrow")


def plan(src: Path, run: Path, rps: int = 400, **kw: object) -> list[RangeRef]:
    shards, manifest = plan_input(src, run, rps, **{"id_field": None, **kw})
    assert manifest.id_field == "id"  # detected from the first row
    return shards


def hf_layout(root: Path) -> int:
    """Hugging Face's ``data/train-0000N-of-0000M.parquet``: several row groups per file, one file
    without rows, one small."""
    sizes = [700, 0, 30, 2500]
    first = 0
    for i, n in enumerate(sizes):
        parquet_part(
            root / "data" / f"train-{i:05d}-of-{len(sizes):05d}.parquet", first, n, group=100 if i else 250
        )
        first += n
    return first


def test_parquet_parts_are_planned_from_their_footers_in_whole_row_groups(tmp_path: Path) -> None:
    total = hf_layout(tmp_path)
    shards, _ = plan_input(tmp_path / "data", tmp_path / "run")
    ids, rejects = read_shards(shards)
    assert ids == [f"r{i}" for i in range(total)] and not rejects
    assert sum(s.records for s in shards) == total  # rows are exact
    pieces = pieces_of(shards)
    assert not any("train-00001" in p for ps in pieces for p in ps)  # no rows: nothing
    assert pieces[1] == [  # a small file grouped whole, between whole row groups of the others
        "train-00000-of-00004.parquet[2, 3]",
        "train-00002-of-00004.parquet[0, 1]",
        "train-00003-of-00004.parquet[0, 2]",
    ]
    assert all(s.pieces and all(p.rows is not None and p.range is None for p in s.pieces) for s in shards)
    assert size_input(list_input(str(tmp_path / "data"))).records == total


def test_a_single_parquet_file_is_planned_by_row_groups_from_its_footer(tmp_path: Path) -> None:
    parquet_part(
        tmp_path / "one.parquet", 0, 1000, group=100, t=[os.urandom(1000).hex() for _ in range(1000)]
    )
    shards, manifest = plan_input(tmp_path / "one.parquet", tmp_path / "run")
    assert [s.records for s in shards] == [400, 400, 200] and shards[0].uri == str(tmp_path / "one.parquet")
    assert (tmp_path / "one.parquet").stat().st_size > 2_000_000
    assert manifest.planning is not None and manifest.planning["bytes_read"] <= 64 * 1024  # the footer
    assert read_shards(shards)[0] == [f"r{i}" for i in range(1000)]


def test_a_corrupt_footer_refuses_the_plan_naming_the_file(tmp_path: Path) -> None:
    hf_layout(tmp_path)
    bad = tmp_path / "data" / "train-00002-of-00004.parquet"
    bad.write_bytes(bad.read_bytes()[:-9] + b"garbage!!")
    with pytest.raises(CorruptFileError, match=r"train-00002-of-00004\.parquet.*remove it from the input"):
        plan(tmp_path / "data", tmp_path / "run")


def test_a_corrupt_row_group_fails_its_shard_only(tmp_path: Path) -> None:
    parquet_part(tmp_path / "data" / "a.parquet", 0, 400, group=400)
    parquet_part(tmp_path / "data" / "b.parquet", 400, 400, group=400, q=["y" * 4000] * 400)
    data = bytearray((tmp_path / "data" / "b.parquet").read_bytes())
    data[100:3000] = b"\xff" * 2900  # the pages of its one row group; the footer intact
    (tmp_path / "data" / "b.parquet").write_bytes(bytes(data))
    first, second = plan(tmp_path / "data", tmp_path / "run")
    assert len(read_shards([first])[0]) == 400
    with pytest.raises(CorruptFileError, match=r"b\.parquet: row groups \[0, 1\) cannot be read"):
        read_shards([second])


def test_bad_rows_and_repeats_name_their_part_row_group_and_row(tmp_path: Path) -> None:
    src = tmp_path / "data"
    parquet_part(src / "p0.parquet", 0, 5, group=2)
    parquet_part(src / "p1.parquet", 5, 5, group=2, v=[1.0, 2.0, float("nan"), 4.0, 5.0])
    parquet_part(src / "p2.parquet", 0, 1)  # r0 again
    (shard,) = plan(src, tmp_path / "run")
    ids, rejects = read_shards([shard])
    assert ids == [f"r{i}" for i in range(10) if i != 7]
    nan, again = rejects
    assert (nan["source"], nan["row_group"], nan["line_in_part"], nan["line_in_range"]) == (
        str(src / "p1.parquet"),
        1,
        3,
        8,
    )
    assert "NaN" in nan["error"] and "offset" not in nan
    assert (again["source"], again["row_group"], again["line_in_part"]) == (str(src / "p2.parquet"), 0, 1)
    assert "duplicate id 'r0'" in again["error"]


def test_assigned_ids_name_the_part_and_row(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "data").mkdir()
    pq.write_table(pa.table({"q": ["a", "b", "c"]}), tmp_path / "data" / "p.parquet", row_group_size=2)
    shards, _ = plan_input(tmp_path / "data", tmp_path / "run", 10, assign_ids=True)
    got = [r["id"] for r in read_range(shards[0], id_field="id", assign_ids=True, rejects=Sink())]
    assert got == ["p.parquet#1", "p.parquet#2", "p.parquet#3"]
    # one file given as the input (the shards' own root): the same ids
    one, _ = plan_input(tmp_path / "data" / "p.parquet", tmp_path / "run1", 10, assign_ids=True)
    assert [r["id"] for r in read_range(one[0], id_field="id", assign_ids=True, rejects=Sink())] == got


def test_parts_without_rows_only_are_refused(tmp_path: Path) -> None:
    parquet_part(tmp_path / "data" / "p.parquet", 0, 0)
    with pytest.raises(ConfigError, match=r"holds no records.*Remedy"):
        plan(tmp_path / "data", tmp_path / "run")


def test_batchinfer_plan_sizes_a_parquet_input_from_its_footers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from airflow_batchinfer.cli import main

    total = hf_layout(tmp_path)
    assert main(["plan", "--input", str(tmp_path / "data"), "--gpus", "1", "--tokens-per-s", "1000"]) == 0
    first, second = capsys.readouterr().out.splitlines()[:2]
    assert first.startswith(f"input {tmp_path / 'data'}: 4 part(s), ") and first.endswith(
        f"{total:,} records (from the footers)"
    )
    assert second.startswith(f"{total:,} records on 1 GPU ")


def test_the_id_field_is_detected_past_a_first_part_without_rows(tmp_path: Path) -> None:
    """A first part with a footer but no rows yields no record: detection reads the next part's, so an
    OpenAI-style dataset (custom_id and body) is not read with ``id`` and rejected row by row."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    def write(name: str, n: int) -> None:
        rows = {"custom_id": [f"c{i}" for i in range(n)], "body": [{"q": "x"}] * n}
        buf = io.BytesIO()
        pq.write_table(
            pa.table(
                rows,
                schema=pa.schema([("custom_id", pa.string()), ("body", pa.struct([("q", pa.string())]))]),
            ),
            buf,
        )
        (tmp_path / "data").mkdir(exist_ok=True)
        (tmp_path / "data" / name).write_bytes(buf.getvalue())

    write("part-0.parquet", 0)
    write("part-1.parquet", 5)
    shards, manifest = plan_input(tmp_path / "data", tmp_path / "run", id_field=None)
    assert manifest.id_field == "custom_id"
    rejects = Sink()
    rows = [r for s in shards for r in read_range(s, id_field="custom_id", assign_ids=False, rejects=rejects)]
    assert [r["custom_id"] for r in rows] == [f"c{i}" for i in range(5)] and not rejects
