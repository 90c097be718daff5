"""Byte streams to lines: zstd decoding (multi-frame, truncation-checked) and line splitting.

This is the hot path of every read, so it works on whole chunks and leaves JSON parsing to callers.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator
from typing import BinaryIO, Self

import zstandard

from airflow_batchinfer.exceptions import CorruptFileError

READ_SIZE = 64 * 1024
# Compressed bytes handed to the decompressor per call. A zstd block decodes to at most 128 KiB and
# takes at least 4 stored bytes, so one call yields at most 64 blocks (8 MiB, under the default
# max_line_bytes) however compressible the input (a run of one byte compresses ~30,000:1: 8 KiB fed
# at once could decode to 256 MiB). Outputs are joined back into chunks of about READ_SIZE; a
# 256-byte feed decodes typical JSONL within a few % of an 8 KiB one (64 bytes: ~2.4x slower).
FEED_SIZE = 256
ZSTD_SUFFIXES = (".zst", ".zstd")
MAX_LINE_BYTES = 16 * 1024 * 1024  # the max_line_bytes setting's default (spec/settings.py)
MIN_LINE_BYTES = 1024  # ... and its least value
RAW_PREFIX = 1024  # bytes of an oversized line kept for its reject row


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
    outs: list[bytes] = []  # decoded pieces not yet handed out, fewer than READ_SIZE bytes
    held = 0
    try:
        while read := raw.read(READ_SIZE):
            for start in range(0, len(read), FEED_SIZE):
                data = read[start : start + FEED_SIZE]
                while data:
                    in_frame = True
                    out = dobj.decompress(data)
                    if out:
                        outs.append(out)
                        held += len(out)
                    if not dobj.eof:
                        break
                    # One frame ended; the rest of this piece belongs to the next frame.
                    data = dobj.unused_data
                    dobj = dctx.decompressobj()
                    in_frame = False
                if held >= READ_SIZE:
                    yield from _pieces(b"".join(outs))
                    outs, held = [], 0
    except zstandard.ZstdError as exc:
        raise CorruptFileError(
            f"{source}: invalid zstd data ({exc}). The file is damaged; regenerate it from its source."
        ) from exc
    if in_frame:
        raise CorruptFileError(
            f"{source}: zstd stream ends inside a frame (truncated file). Regenerate it from its source."
        )
    if outs:
        yield b"".join(outs)


def _pieces(data: bytes) -> Iterator[bytes]:
    """``data`` in chunks of READ_SIZE (one decoder call can yield up to 8 MiB: see FEED_SIZE)."""
    if len(data) < 2 * READ_SIZE:
        yield data
        return
    for start in range(0, len(data), READ_SIZE):
        yield data[start : start + READ_SIZE]


class BadLine(bytes):
    """A line a reader yields in place of one it could not take: validators
    (:class:`~airflow_batchinfer.storage.validate.LineValidator`) reject it with :meth:`reason`. Its
    value is what the reject row keeps as ``raw`` (the line's first bytes, or a description), ``size``
    the bytes the line took in its input (a range's byte offsets move past it)."""

    size: int

    def __new__(cls, raw: bytes, size: int) -> Self:
        line = super().__new__(cls, raw)
        line.size = size
        return line

    @abstractmethod
    def reason(self) -> str:
        """Why the line is rejected (each kind of bad line says it)."""


class OversizedLine(BadLine):
    """A line longer than a read's ``max_line`` bytes, never held whole: its value is the line's
    first bytes (at most :data:`RAW_PREFIX`, cut at a UTF-8 character), ``size`` its length up to its
    ``\\n`` (a CRLF line's ``\\r`` included) and ``limit`` the bound it broke. Readers that validate
    (:class:`~airflow_batchinfer.storage.validate.LineValidator`, ``RecordReader``) reject it."""

    limit: int

    def __new__(cls, head: bytes, size: int, limit: int) -> OversizedLine:
        line = super().__new__(cls, utf8_prefix(head[: RAW_PREFIX + 3]), size)
        line.limit = limit
        return line

    def reason(self) -> str:
        return (
            f"line of {self.size:,} bytes is longer than max_line_bytes={self.limit:,} (the reject keeps "
            f"its first {len(self)} bytes); shorten the line, or raise the max_line_bytes setting"
        )


def utf8_prefix(head: bytes) -> bytes:
    """The first RAW_PREFIX bytes of ``head``, less a UTF-8 character the cut would split."""
    cut = head[:RAW_PREFIX]
    if len(head) <= RAW_PREFIX:
        return cut
    for back in range(4):  # a character is at most 4 bytes
        try:
            (cut[: len(cut) - back]).decode("utf-8")
            return cut[: len(cut) - back]
        except UnicodeDecodeError:
            continue
    return cut  # not UTF-8 anyway: the reject row keeps it as raw_base64


class LineSplitter:
    """Decoded chunks to blocks of lines (see :func:`iter_line_blocks`), holding at most
    ``max_line`` bytes of a line that spans chunks: a longer line is skipped chunk by chunk and comes
    out as an :class:`OversizedLine`. ``None``: no bound (a line is joined
    whole, however long). ``peak`` is the most bytes it held for one line besides the chunk at hand.
    """

    def __init__(self, *, strip_cr: bool = True, max_line: int | None = None) -> None:
        if max_line is not None and max_line < 1:
            raise ValueError(f"max_line must be >= 1 or None, got {max_line}")
        self.strip_cr = strip_cr
        self.max_line = max_line
        self.peak = 0
        self._pending: list[bytes] = []  # a line spanning chunks; a list, so long lines stay linear
        self._held = 0  # bytes in _pending
        self._skip: list[int] | None = None  # an oversized line being skipped: [size so far]
        self._head = b""  # its first bytes

    def blocks(self, chunks: Iterator[bytes]) -> Iterator[list[bytes]]:
        for chunk in chunks:
            if self._skip is not None:
                i = chunk.find(b"\n")
                if i < 0:
                    self._skip[0] += len(chunk)
                    continue
                self._skip[0] += i
                yield [self._skipped()]
                chunk = chunk[i + 1 :]
                if not chunk:
                    continue
            lines = chunk.split(b"\n")
            if len(lines) == 1:
                self._hold(chunk)
                continue
            if self._pending:
                lines[0] = self._join(lines[0])
            tail = lines.pop()
            if tail:
                self._hold(tail)
            limit = self.max_line
            if limit is not None and max(map(len, lines)) > limit:  # a long line inside one chunk
                lines = [OversizedLine(x, len(x), limit) if len(x) > limit else x for x in lines]
            # CRLF: a C-speed test first; a "\r" split from its "\n" by a chunk edge sits in lines[0].
            if self.strip_cr and (b"\r" in chunk or lines[0].endswith(b"\r")):
                lines = _strip_cr(lines)
            yield lines
        if self._skip is not None:
            yield [self._skipped()]
        elif self._pending:
            last = [self._join(b"")]
            yield _strip_cr(last) if self.strip_cr else last

    def _hold(self, piece: bytes) -> None:
        """Keep ``piece`` of the line that continues in the next chunk, or start skipping it."""
        self._pending.append(piece)
        self._held += len(piece)
        self.peak = max(self.peak, self._held)
        if self.max_line is not None and self._held > self.max_line:
            self._head = _first_bytes(self._pending, RAW_PREFIX + 3)
            self._skip = [self._held]
            self._pending, self._held = [], 0

    def _join(self, end: bytes) -> bytes:
        """The held line, ended by ``end`` (an :class:`OversizedLine` if that makes it too long)."""
        size = self._held + len(end)
        pieces, self._pending, self._held = [*self._pending, end], [], 0
        if self.max_line is not None and size > self.max_line:
            return OversizedLine(_first_bytes(pieces, RAW_PREFIX + 3), size, self.max_line)
        return b"".join(pieces)

    def _skipped(self) -> OversizedLine:
        assert self._skip is not None and self.max_line is not None
        line = OversizedLine(self._head, self._skip[0], self.max_line)
        self._skip, self._head = None, b""
        return line


def _first_bytes(pieces: list[bytes], n: int) -> bytes:
    out = bytearray()
    for piece in pieces:
        out += piece[: n - len(out)]
        if len(out) >= n:
            break
    return bytes(out)


def iter_line_blocks(
    chunks: Iterator[bytes], *, strip_cr: bool = True, max_line: int | None = None
) -> Iterator[list[bytes]]:
    """Lists of complete lines, one list per decoded chunk, without ``\n`` / ``\r\n`` terminators.

    Blank lines are kept (callers count them); a last line without a newline is a line. Working a
    chunk at a time keeps the per-line cost in C (``bytes.split``). ``strip_cr=False`` keeps a
    ``\r`` before the ``\n`` (for callers that need each line's byte offset). A line longer than
    ``max_line`` bytes is never held whole: it comes as an :class:`OversizedLine` (its first bytes).
    """
    return LineSplitter(strip_cr=strip_cr, max_line=max_line).blocks(chunks)


def _strip_cr(lines: list[bytes]) -> list[bytes]:
    return [line[:-1] if line.endswith(b"\r") and type(line) is bytes else line for line in lines]


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


def iter_lines(chunks: Iterator[bytes], *, max_line: int | None = None) -> Iterator[tuple[int, bytes]]:
    """``(line_no, line)`` pairs, 1-based; see :func:`iter_line_blocks`."""
    line_no = 0
    for block in iter_line_blocks(chunks, max_line=max_line):
        for line in block:
            line_no += 1
            yield line_no, line
