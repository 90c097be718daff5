"""The frames of a multi-frame zstd file, found from a few small reads: a seekable-format seek table
(one read), pzstd's frame-size skippable frames (one read per frame) or else the frames' block headers
(a few bytes per 128 KiB block: cheap locally; on S3 it reads the compressed file once, hence the
README's advice to use ``pzstd`` or the seekable format). Range planning
(:mod:`~airflow_batchinfer.storage.range_plan`) groups them into shards."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import BinaryIO

from airflow_batchinfer.exceptions import CorruptFileError

ZSTD_MAGIC = 0xFD2FB528
SKIPPABLE_MASK, SKIPPABLE_MAGIC = 0xFFFFFFF0, 0x184D2A50
PZSTD_MAGIC = 0x184D2A50  # pzstd: a 4-byte skippable frame before each frame holds its compressed size
SEEKABLE_MAGIC = 0x8F92EAB1  # zstd seekable format: the seek table's footer ends with it


@dataclass(frozen=True)
class Frame:
    """Stored bytes ``[start, end)`` holding one zstd frame (with any skippable frames before it);
    ``content`` is its decoded size when the frame header says."""

    start: int
    end: int
    content: int | None = None


def zstd_frames(raw: BinaryIO, size: int, source: str) -> list[Frame]:
    """The data frames of a zstd file, each with the skippable frames before it (a trailing seek
    table joins the last). From a seekable-format seek table when there is one, else by walking
    frame and block headers (pzstd's size frames let the walk jump over whole frames)."""
    table = _seek_table(raw, size)
    if table is not None:
        return table
    frames: list[Frame] = []
    pos = start = 0
    jump: int | None = None  # a pzstd size frame told where the next frame ends
    while pos < size:
        raw.seek(pos)
        head = raw.read(18)
        if len(head) < 8:
            raise CorruptFileError(f"{source}: truncated zstd frame at byte {pos}. Regenerate the file.")
        (magic,) = struct.unpack_from("<I", head)
        if magic & SKIPPABLE_MASK == SKIPPABLE_MAGIC:
            (length,) = struct.unpack_from("<I", head, 4)
            if magic == PZSTD_MAGIC and length == 4 and len(head) >= 12:
                jump = pos + 12 + struct.unpack_from("<I", head, 8)[0]
            pos += 8 + length
            continue
        if magic != ZSTD_MAGIC:
            raise CorruptFileError(f"{source}: no zstd frame at byte {pos}: not zstd, or damaged.")
        content, header = _frame_header(head, source, pos)
        if jump is not None and jump > pos:
            pos, jump = jump, None
        else:
            pos = _walk_blocks(raw, pos + header, head[4], source)
        frames.append(Frame(start, pos, content))
        start = pos
    if start < size and frames:  # trailing skippable frames (a seek table)
        frames[-1] = Frame(frames[-1].start, size, frames[-1].content)
    return frames


def _frame_header(head: bytes, source: str, pos: int) -> tuple[int | None, int]:
    """(decoded size if stated, header length) of the frame whose first bytes are ``head``."""
    fhd = head[4]
    fcs_flag, single, did_flag = fhd >> 6, (fhd >> 5) & 1, fhd & 3
    did = (0, 1, 2, 4)[did_flag]
    fcs = (1 if single else 0, 2, 4, 8)[fcs_flag]
    at = 5 + (0 if single else 1) + did
    if len(head) < at + fcs:
        raise CorruptFileError(f"{source}: truncated zstd frame header at byte {pos}. Regenerate the file.")
    content = int.from_bytes(head[at : at + fcs], "little") if fcs else None
    if content is not None and fcs == 2:
        content += 256
    return content, at + fcs


def _walk_blocks(raw: BinaryIO, pos: int, fhd: int, source: str) -> int:
    """The end of a frame whose blocks start at ``pos``: block headers are 3 bytes, so this reads a
    few bytes per block (at most 128 KiB of frame each)."""
    while True:
        raw.seek(pos)
        b = raw.read(3)
        if len(b) < 3:
            raise CorruptFileError(f"{source}: zstd frame truncated at byte {pos}. Regenerate the file.")
        header = int.from_bytes(b, "little")
        last, kind, length = header & 1, (header >> 1) & 3, header >> 3
        if kind == 3:
            raise CorruptFileError(f"{source}: invalid zstd block at byte {pos}. Regenerate the file.")
        pos += 3 + (1 if kind == 1 else length)
        if last:
            return pos + (4 if fhd & 4 else 0)  # the content checksum


def _seek_table(raw: BinaryIO, size: int) -> list[Frame] | None:
    """Frames from a zstd seekable-format seek table (the file's last skippable frame), if any."""
    if size < 17:
        return None
    raw.seek(size - 9)
    foot = raw.read(9)
    n, desc, magic = struct.unpack("<IBI", foot)
    if magic != SEEKABLE_MAGIC:
        return None
    entry = 12 if desc & 0x80 else 8
    table_size = n * entry + 9
    if size < table_size + 8:
        return None
    raw.seek(size - table_size)
    table = raw.read(table_size)
    frames, pos = [], 0
    for i in range(n):
        csize, dsize = struct.unpack_from("<II", table, i * entry)
        frames.append(Frame(pos, pos + csize, dsize))
        pos += csize
    if frames:
        frames[-1] = Frame(frames[-1].start, size, frames[-1].content)
    return frames
