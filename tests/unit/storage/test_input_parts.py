"""Issue 38, items 1 and 6: the input is a file, a directory or a glob of part files, listed once,
planned and read in place (JSONL byte ranges, zstd frame groups), every part pinned."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_batchinfer.exceptions import ConfigError, OutputExistsError, StorageError
from airflow_batchinfer.storage.input_parts import list_input, natural_key
from airflow_batchinfer.storage.part_plan import plan_parts
from airflow_batchinfer.storage.ranges import InputRange, piece_uris, range_params, read_range
from airflow_batchinfer.storage.shard_ref import RangeRef, parse_ref
from tests.support.frames import Sink
from tests.support.parts import part_bytes, pieces_of, plan_input, read_shards, write_parts


def plan(src: Path | str, run: Path, rps: int = 400, **kw: object) -> list[RangeRef]:
    return plan_input(src, run, rps, **kw)[0]


def test_a_directory_lists_its_parts_in_natural_order_skipping_markers(tmp_path: Path) -> None:
    src = tmp_path / "in"
    write_parts(src, [3] * 11)
    (src / "_SUCCESS").write_bytes(b"")
    (src / ".part-1.jsonl.crc").write_bytes(b"x")
    (src / "_temporary" / "0").mkdir(parents=True)
    (src / "_temporary" / "0" / "part-99.jsonl").write_bytes(b"{}\n")
    (src / "sub").mkdir()
    (src / "sub" / "part-0.jsonl").write_bytes(part_bytes(100, 2))
    inp = list_input(str(src))
    names = [p.uri[len(str(src)) + 1 :] for p in inp.parts]
    assert names == [*(f"part-{i}.jsonl" for i in range(11)), "sub/part-0.jsonl"]  # part-10 after part-9
    assert (inp.kind, inp.format, inp.root) == ("dir", "jsonl", str(src))
    assert all(p.size > 0 and p.version.startswith(f"{p.size}:") for p in inp.parts)
    assert sorted(["p-10", "p-9", "p-100"], key=natural_key) == ["p-9", "p-10", "p-100"]


def test_a_glob_names_the_parts_and_its_root_is_the_fixed_prefix(tmp_path: Path) -> None:
    write_parts(tmp_path / "in", [2, 2, 2])
    (tmp_path / "in" / "notes.txt").write_text("not data")
    inp = list_input(str(tmp_path / "in" / "part-*.jsonl"))
    assert (inp.kind, inp.root, len(inp.parts)) == ("glob", str(tmp_path / "in"), 3)


@pytest.mark.parametrize(
    ("files", "match"),
    [
        ({"part-0.jsonl": b"{}\n", "part-1.jsonl.zst": b"x"}, "mixes part formats .*jsonl.zst"),
        ({"part-0.jsonl": b"{}\n", "notes.txt": b"", "a.csv": b""}, "not .*parts \\(a.csv, notes.txt\\)"),
        ({"_SUCCESS": b""}, "holds no .* parts.*Remedy"),
    ],
)
def test_a_directory_that_is_not_one_format_of_parts_is_refused(
    tmp_path: Path, files: dict[str, bytes], match: str
) -> None:
    (tmp_path / "in").mkdir()
    for name, data in files.items():
        (tmp_path / "in" / name).write_bytes(data)
    with pytest.raises(ConfigError, match=match):
        list_input(str(tmp_path / "in"))


def test_parts_of_mixed_sizes_are_read_once_small_grouped_large_split(tmp_path: Path) -> None:
    total = write_parts(tmp_path / "in", [5, 30, 0, 7, 2500, 12, 3])
    shards = plan(tmp_path / "in", tmp_path / "run")
    ids, rejects = read_shards(shards)
    assert ids == [f"r{i}" for i in range(total)] and not rejects  # each record once, in part order
    pieces = pieces_of(shards)
    sizes = [len(part_bytes(0, 5)), len(part_bytes(5, 30))]
    assert pieces[0][:2] == [f"part-0.jsonl[0, {sizes[0]}]", f"part-1.jsonl[0, {sizes[1]}]"]  # grouped
    assert all("part-2.jsonl" not in p for ps in pieces for p in ps)  # the empty part: nothing
    assert sum("part-4.jsonl" in p for ps in pieces for p in ps) >= 6  # the large one split
    assert [p.split("[")[0] for p in pieces[-1][-2:]] == ["part-5.jsonl", "part-6.jsonl"]  # whole
    assert all(abs(s.records - 400) < 60 for s in shards[:-1])
    starts = [s.start for s in shards]
    assert starts == sorted(starts) and all(
        s.uri == str(tmp_path / "in") and s.version is None for s in shards
    )


def test_zstd_parts_split_by_frames_and_a_single_frame_part_is_one_piece(tmp_path: Path) -> None:
    total = write_parts(tmp_path / "in", [40, 1500, 8], ext=".jsonl.zst", frame_lines=64)
    (tmp_path / "in" / "part-3.jsonl.zst").write_bytes(part_bytes(total, 5000, zstd=True))  # one frame
    shards = plan(tmp_path / "in", tmp_path / "run")
    ids, _ = read_shards(shards)
    assert ids == [f"r{i}" for i in range(total + 5000)]
    split = [p for s in shards for p in s.pieces or () if p.uri.endswith("part-1.jsonl.zst")]
    assert len(split) >= 3 and all(p.lead_in is not None for p in split[1:])
    single = [p for s in shards for p in s.pieces or () if p.uri.endswith("part-3.jsonl.zst")]
    assert len(single) == 1 and single[0].lead_in is None
    notices = plan_parts(
        list_input(str(tmp_path / "in")), records_per_shard=400, max_bytes_per_shard=1 << 30
    ).notices
    assert len(notices) == 1 and "part-3.jsonl.zst is one zstd frame" in notices[0]
    assert "batchinfer shard" in notices[0]  # a single-frame part twice a shard's size: the notice


def test_the_taper_runs_across_the_whole_input(tmp_path: Path) -> None:
    write_parts(tmp_path / "in", [4000] * 4)
    flat = plan(tmp_path / "in", tmp_path / "a", rps=4000)
    tapered = plan(tmp_path / "in", tmp_path / "b", rps=4000, lanes=2)
    assert len(tapered) > len(flat) and tapered[-1].records < tapered[0].records / 2
    assert read_shards(tapered)[0] == read_shards(flat)[0]


def test_a_single_file_keeps_its_refs_exactly(tmp_path: Path) -> None:
    write_parts(tmp_path, [300])
    (shard,) = plan(tmp_path / "part-0.jsonl", tmp_path / "run")
    assert shard.pieces is None and shard.uri == str(tmp_path / "part-0.jsonl") and shard.version
    assert (
        "pieces" not in shard.to_json()
        and "pieces" not in range_params(shard, id_field="id", assign_ids=False)["input_range"]
    )


def test_a_part_ref_round_trips_through_the_job_params(tmp_path: Path) -> None:
    write_parts(tmp_path / "in", [5, 5])
    (shard,) = plan(tmp_path / "in", tmp_path / "run")
    assert parse_ref(shard.to_json()) == shard
    params = range_params(shard, id_field="id", assign_ids=False)
    assert InputRange.from_params(params["input_range"]).pieces == shard.pieces
    assert piece_uris(params) == [
        str(tmp_path / "in" / "part-0.jsonl"),
        str(tmp_path / "in" / "part-1.jsonl"),
    ]


@pytest.mark.parametrize(("change", "match"), [("replace", "changed since"), ("remove", "is gone")])
def test_a_part_replaced_or_removed_after_planning_is_refused(
    tmp_path: Path, change: str, match: str
) -> None:
    write_parts(tmp_path / "in", [5, 5, 5])
    (shard,) = plan(tmp_path / "in", tmp_path / "run")
    part = tmp_path / "in" / "part-1.jsonl"
    if change == "replace":
        part.write_bytes(part_bytes(50, 5))
    else:
        part.unlink()
    with pytest.raises(StorageError, match=f"part .*part-1.jsonl of the input {match} .*Remedy"):
        list(read_range(shard, id_field="id", assign_ids=False, rejects=Sink()))


def test_a_part_added_after_planning_refuses_the_plan_again(tmp_path: Path) -> None:
    write_parts(tmp_path / "in", [5, 5])
    plan(tmp_path / "in", tmp_path / "run")
    assert plan(tmp_path / "in", tmp_path / "run")  # the same parts: reused
    (tmp_path / "in" / "part-2.jsonl").write_bytes(part_bytes(10, 5))
    with pytest.raises(OutputExistsError, match=r"a part .*added, removed or rewritten"):
        plan(tmp_path / "in", tmp_path / "run")


def test_bad_lines_name_their_part_and_ids_repeated_across_parts_in_a_range_are_rejected(
    tmp_path: Path,
) -> None:
    src = tmp_path / "in"
    write_parts(src, [3, 3])
    (src / "part-1.jsonl").write_bytes(part_bytes(3, 1) + b"not json\n" + part_bytes(0, 1))  # r0 again
    (shard,) = plan(src, tmp_path / "run")
    ids, rejects = read_shards([shard])
    assert ids == ["r0", "r1", "r2", "r3"]
    bad, repeat = rejects
    assert (bad["source"], bad["line_in_part"], bad["offset"], bad["line_in_range"]) == (
        str(src / "part-1.jsonl"),
        2,
        len(part_bytes(3, 1)),
        5,
    )
    assert repeat["source"] == str(src / "part-1.jsonl") and repeat["line_in_part"] == 3
    assert "duplicate id 'r0'" in repeat["error"]


def test_assigned_ids_name_the_part(tmp_path: Path) -> None:
    src = tmp_path / "in"
    (src / "a").mkdir(parents=True)
    (src / "a" / "part-0.jsonl").write_bytes(b'{"q": 1}\n{"q": 2}\n')
    (src / "part-1.jsonl").write_bytes(b'{"q": 3}\n')
    (shard,) = plan(src, tmp_path / "run", id_field="id", assign_ids=True)
    got = [r["id"] for r in read_range(shard, id_field="id", assign_ids=True, rejects=Sink())]
    assert got == ["a/part-0.jsonl@0", "a/part-0.jsonl@9", "part-1.jsonl@0"]
