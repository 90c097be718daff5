"""Byte streams to lines: zstd decoding (multi-frame, truncation-checked) and line splitting.

This is the hot path of every read, so it works on whole chunks and leaves JSON parsing to callers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

import zstandard

from airflow_batchinfer.exceptions import CorruptFileError

READ_SIZE = 64 * 1024
# Compressed bytes handed to the decompressor per call: output per call is this times the
# compression ratio, so highly compressible shards still decode in small pieces.
FEED_SIZE = 8 * 1024
ZSTD_SUFFIXES = (".zst", ".zstd")


def is_zstd(name: str) -> bool:
    """Whether a file name denotes zstd compression (``.jsonl.zst`` / ``.jsonl.zstd``, any case)."""
    return name.lower().endswith(ZSTD_SUFFIXES)


def iter_chunks(raw: BinaryIO, *, zstd: bool, source: str) -> Iterator[bytes]:
    """Decoded bytes of ``raw`` in chunks, reading it ``READ_SIZE`` bytes at a time.

    zstd input may hold several frames (concatenated files, or a writer that flushed frames); all
    are read. A stream that ends inside a frame raises :class:`CorruptFileError` instead of
    silently returning a short read.
    """
    if not zstd:
        while chunk := raw.read(READ_SIZE):
            yield chunk
        return
    dctx = zstandard.ZstdDecompressor()
    dobj = dctx.decompressobj()
    in_frame = False
    try:
        while read := raw.read(READ_SIZE):
            for start in range(0, len(read), FEED_SIZE):
                data = read[start : start + FEED_SIZE]
                while data:
                    in_frame = True
                    out = dobj.decompress(data)
                    if out:
                        yield out
                    if not dobj.eof:
                        break
                    # One frame ended; the rest of this piece belongs to the next frame.
                    data = dobj.unused_data
                    dobj = dctx.decompressobj()
                    in_frame = False
    except zstandard.ZstdError as exc:
        raise CorruptFileError(
            f"{source}: invalid zstd data ({exc}). The file is damaged; regenerate it from its source."
        ) from exc
    if in_frame:
        raise CorruptFileError(
            f"{source}: zstd stream ends inside a frame (truncated file). Regenerate it from its source."
        )


def iter_line_blocks(chunks: Iterator[bytes], *, strip_cr: bool = True) -> Iterator[list[bytes]]:
    """Lists of complete lines, one list per decoded chunk, without ``\n`` / ``\r\n`` terminators.

    Blank lines are kept (callers count them); a last line without a newline is a line. Working a
    chunk at a time keeps the per-line cost in C (``bytes.split``). ``strip_cr=False`` keeps a
    ``\r`` before the ``\n`` (for callers that need each line's byte offset).
    """
    pending: list[bytes] = []  # pieces of a line that spans chunks; a list, so huge lines stay linear
    for chunk in chunks:
        lines = chunk.split(b"\n")
        if len(lines) == 1:
            pending.append(chunk)
            continue
        if pending:
            pending.append(lines[0])
            lines[0] = b"".join(pending)
            pending = []
        tail = lines.pop()
        if tail:
            pending.append(tail)
        # CRLF: a C-speed test first; a "\r" split from its "\n" by a chunk edge sits in lines[0].
        if strip_cr and (b"\r" in chunk or lines[0].endswith(b"\r")):
            lines = _strip_cr(lines)
        yield lines
    if pending:
        last = [b"".join(pending)]
        yield _strip_cr(last) if strip_cr else last


def _strip_cr(lines: list[bytes]) -> list[bytes]:
    return [line[:-1] if line.endswith(b"\r") else line for line in lines]


class RangeReader:
    """A binary file read from ``start`` to ``end`` only (``read`` returns ``b""`` at ``end``): one
    shard of a bigger file, fetched by ranged reads on object stores."""

    def __init__(self, raw: BinaryIO, start: int, end: int) -> None:
        raw.seek(start)
        self._raw = raw
        self._left = max(0, end - start)

    def read(self, n: int = -1) -> bytes:
        n = self._left if n < 0 else min(n, self._left)
        data = self._raw.read(n) if n else b""
        self._left -= len(data)
        return data


def iter_lines(chunks: Iterator[bytes]) -> Iterator[tuple[int, bytes]]:
    """``(line_no, line)`` pairs, 1-based; see :func:`iter_line_blocks`."""
    line_no = 0
    for block in iter_line_blocks(chunks):
        for line in block:
            line_no += 1
            yield line_no, line
