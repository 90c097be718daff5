"""storage.swap.update: read-modify-write of one small file, on a local disk and on the real S3
server (SeaweedFS honours S3's conditional writes), where a concurrent writer's change is never lost."""

from __future__ import annotations

import uuid

import fsspec
import pytest

from airflow_batchinfer.exceptions import StorageError
from airflow_batchinfer.storage import swap
from airflow_batchinfer.storage.location import Location, resolve
from tests.support.roots import Root
from tests.support.seaweedfs import S3Server


def s3_location(server: S3Server, name: str) -> Location:
    return resolve(f"s3://{server.bucket}/{uuid.uuid4().hex}/{name}", server.storage_options())


def test_update_creates_then_changes_a_file(root: Root) -> None:
    loc = resolve(root.uri("log.jsonl"), root.storage_options)
    seen: list[bytes | None] = []

    def add(line: bytes):  # type: ignore[no-untyped-def]
        def change(current: bytes | None) -> bytes:
            seen.append(current)
            return (current or b"") + line

        return change

    assert swap.update(loc, add(b"a\n")) == b"a\n"
    assert swap.update(loc, add(b"b\n")) == b"a\nb\n"
    assert seen == [None, b"a\n"]
    assert loc.fs.cat_file(loc.path) == b"a\nb\n"


def test_a_failing_change_leaves_the_file_as_it_was(root: Root) -> None:
    loc = resolve(root.uri("log.jsonl"), root.storage_options)
    swap.update(loc, lambda current: b"kept\n")

    def broken(current: bytes | None) -> bytes:
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        swap.update(loc, broken)
    assert loc.fs.cat_file(loc.path) == b"kept\n"


@pytest.mark.s3
def test_s3_a_writer_that_lost_the_race_reads_again(s3_server: S3Server) -> None:
    """Another writer changes the object between this one's read and its write (the write's
    If-Match no longer holds): this one reads again, so both changes are in the object."""
    loc = s3_location(s3_server, "log.jsonl")
    swap.update(loc, lambda current: b"first\n")
    calls: list[bytes | None] = []

    def change(current: bytes | None) -> bytes:
        calls.append(current)
        if len(calls) == 1:  # the other writer lands now, after this one's read
            swap.update(loc, lambda c: (c or b"") + b"other\n")
        return (current or b"") + b"mine\n"

    assert swap.update(loc, change) == b"first\nother\nmine\n"
    assert calls == [b"first\n", b"first\nother\n"]
    assert loc.fs.cat_file(loc.path) == b"first\nother\nmine\n"


@pytest.mark.s3
def test_s3_creating_races_too(s3_server: S3Server) -> None:
    """Two writers create the same object: the one that lost (If-None-Match: *) reads the other's."""
    loc = s3_location(s3_server, "new.jsonl")
    calls: list[bytes | None] = []

    def change(current: bytes | None) -> bytes:
        calls.append(current)
        if len(calls) == 1:
            swap.update(loc, lambda c: (c or b"") + b"other\n")
        return (current or b"") + b"mine\n"

    assert swap.update(loc, change) == b"other\nmine\n"
    assert calls == [None, b"other\n"]


@pytest.mark.s3
def test_s3_gives_up_after_too_many_lost_races(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(swap, "TRIES", 3)
    monkeypatch.setattr(swap.time, "sleep", lambda s: None)
    loc = s3_location(s3_server, "busy.jsonl")
    swap.update(loc, lambda current: b"0\n")

    def always_overtaken(current: bytes | None) -> bytes:
        swap.update(loc, lambda c: (c or b"") + b"x\n")
        return (current or b"") + b"mine\n"

    with pytest.raises(StorageError, match="3 concurrent writers in a row"):
        swap.update(loc, always_overtaken)
    assert loc.fs.cat_file(loc.path) == b"0\nx\nx\nx\n"  # the others' changes, not this one's


def test_other_stores_are_written_plainly() -> None:
    loc = resolve(f"memory://swap-{uuid.uuid4().hex}/log.jsonl")
    swap.update(loc, lambda current: (current or b"") + b"a\n")
    swap.update(loc, lambda current: (current or b"") + b"b\n")
    assert fsspec.filesystem("memory").cat_file(loc.path) == b"a\nb\n"
