from __future__ import annotations

import io
import os

import pytest
import zstandard

from airflow_batchinfer.exceptions import CorruptFileError
from airflow_batchinfer.storage.lines import READ_SIZE, is_zstd, iter_chunks, iter_line_blocks, iter_lines


class CountingReader(io.BytesIO):
    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.sizes: list[int] = []

    def read(self, size: int | None = -1) -> bytes:
        self.sizes.append(-1 if size is None else size)
        return super().read(size)


def lines_of(data: bytes, *, zstd: bool = False) -> list[tuple[int, bytes]]:
    return list(iter_lines(iter_chunks(io.BytesIO(data), zstd=zstd, source="mem")))


@pytest.mark.parametrize("name", ["a.jsonl.zst", "A.JSONL.ZST", "b.jsonl.zstd", "c.Jsonl.ZstD"])
def test_zstd_suffixes_any_case(name: str) -> None:
    assert is_zstd(name)


@pytest.mark.parametrize("name", ["a.jsonl", "a.zst.jsonl", "a.jsonl.gz"])
def test_non_zstd_names(name: str) -> None:
    assert not is_zstd(name)


def test_reads_in_64k_chunks() -> None:
    raw = CountingReader(b"x" * (3 * READ_SIZE + 5))
    chunks = list(iter_chunks(raw, zstd=False, source="mem"))
    assert set(raw.sizes) == {READ_SIZE}
    assert b"".join(chunks) == b"x" * (3 * READ_SIZE + 5)


def test_zstd_reads_compressed_input_in_64k_chunks_and_streams_output() -> None:
    payload = b"".join(
        b'{"id": %d, "pad": "%s"}\n' % (i, os.urandom(24).hex().encode()) for i in range(20_000)
    )
    raw = CountingReader(zstandard.ZstdCompressor(level=1).compress(payload))
    chunks = list(iter_chunks(raw, zstd=True, source="mem"))
    assert set(raw.sizes) == {READ_SIZE}
    assert len(chunks) > 1, "output must stream, not arrive as one buffer"
    assert b"".join(chunks) == payload


def test_multi_frame_zstd_is_read_fully() -> None:
    c = zstandard.ZstdCompressor()
    data = c.compress(b'{"id": 1}\n') + c.compress(b'{"id": 2}\n') + c.compress(b'{"id": 3}')
    assert [line for _, line in lines_of(data, zstd=True)] == [b'{"id": 1}', b'{"id": 2}', b'{"id": 3}']


def test_multi_frame_boundary_inside_a_read() -> None:
    c = zstandard.ZstdCompressor(level=1)
    frames = [
        c.compress(b"".join(os.urandom(8).hex().encode() + b"\n" for _ in range(500))) for _ in range(40)
    ]
    data = b"".join(frames)
    assert len(data) > 2 * READ_SIZE  # frames straddle 64 KiB reads
    assert len(lines_of(data, zstd=True)) == 40 * 500


def test_truncated_zstd_raises_corruption_error() -> None:
    data = zstandard.ZstdCompressor().compress(b'{"id": 1}\n' * 10_000)
    with pytest.raises(CorruptFileError, match="truncated"):
        lines_of(data[: len(data) // 2], zstd=True)


def test_truncated_second_frame_raises() -> None:
    c = zstandard.ZstdCompressor()
    second = c.compress(b'{"id": 2}\n' * 1000)
    with pytest.raises(CorruptFileError, match="truncated"):
        lines_of(c.compress(b'{"id": 1}\n') + second[:-4], zstd=True)


def test_garbage_zstd_raises_corruption_error() -> None:
    with pytest.raises(CorruptFileError, match="invalid zstd data"):
        lines_of(b"this is not zstd at all", zstd=True)


def test_empty_zstd_file_has_no_lines() -> None:
    assert lines_of(b"", zstd=True) == []


def test_crlf_blank_lines_and_missing_final_newline() -> None:
    data = b'{"a":1}\r\n\r\n   \n{"b":2}\n{"c":3}'
    assert lines_of(data) == [(1, b'{"a":1}'), (2, b""), (3, b"   "), (4, b'{"b":2}'), (5, b'{"c":3}')]


def test_cr_and_lf_split_across_chunks() -> None:
    blocks = list(iter_line_blocks(iter([b'{"a":1}\r', b'\n{"b":2}\r\n'])))
    assert [line for block in blocks for line in block] == [b'{"a":1}', b'{"b":2}']


def test_line_spanning_many_chunks() -> None:
    big = b"z" * 1000
    chunks = [big] * 300 + [b"\nnext\n"]
    assert list(iter_lines(iter(chunks))) == [(1, big * 300), (2, b"next")]


def test_trailing_newline_adds_no_line() -> None:
    assert lines_of(b"a\nb\n") == [(1, b"a"), (2, b"b")]
