"""Small images made without Pillow (the unit tier's venv has none): PNGs encoded here, and the
headers of JPEG and WebP files."""

from __future__ import annotations

import base64
import random
import struct
import zlib


def png(width: int, height: int, rgb: tuple[int, int, int] = (200, 30, 30), *, noise: bool = False) -> bytes:
    """A solid ``rgb`` PNG of ``width`` x ``height`` (8-bit RGB); ``noise``: random pixels instead
    (seeded: the same each time), which do not compress (a PNG of about 3 bytes a pixel)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    draw = random.Random(0)
    rows = [
        b"\x00" + (draw.randbytes(3 * width) if noise else bytes(rgb) * width)  # filter 0, then the pixels
        for _ in range(height)
    ]
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"".join(rows)))
        + chunk(b"IEND", b"")
    )


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def jpeg_header(width: int, height: int) -> bytes:
    """The start of a baseline JPEG: SOI, an APP0 segment, then its frame header (SOF0)."""
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    sof0 = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + app0 + sof0


def webp_lossless_header(width: int, height: int) -> bytes:
    """The start of a lossless WebP (a VP8L chunk)."""
    bits = (width - 1) | ((height - 1) << 14)
    body = b"\x2f" + struct.pack("<I", bits)
    return (
        b"RIFF"
        + struct.pack("<I", 4 + 8 + len(body))
        + b"WEBP"
        + b"VP8L"
        + struct.pack("<I", len(body))
        + body
    )


def image_message(url: str, text: str = "what is this?") -> list[dict[str, object]]:
    """One user message: ``text`` and the image at ``url``."""
    return [
        {
            "role": "user",
            "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}],
        }
    ]
