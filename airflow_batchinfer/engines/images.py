"""Images in chat requests: OpenAI content parts, loaded by the worker under the deployment's caps.

A message's ``content`` is a string or a list of OpenAI content parts: ``{"type": "text", "text":
...}`` and ``{"type": "image_url", "image_url": {"url": ..., "detail": "auto" | "low" | "high"}}``.
An image's ``url`` is one of:

- a ``data:`` URL (``data:image/png;base64,...``): decoded from the record;
- an object store's URI (``s3://``, ``gs://``, ...) or absolute local path (or ``file://``): read
  by the worker, inside the job's allowed prefixes (:func:`~airflow_batchinfer.storage.confine.refusal`,
  the rule that confines a job's inputs; a path outside is that record's error, naming the prefixes).

Any other URL is refused, whatever the prefix policy (``--allow-any-prefix`` included): ``http(s)://``
and every scheme but ``file://`` and the object stores' (:data:`READABLE_SCHEMES`), and fsspec
chains (``simplecache::http://...``): a worker fetches nothing from the web. Each image must be a PNG,
JPEG or WebP of at most ``max_image_bytes`` bytes and ``max_image_pixels`` pixels (worker settings):
both are checked from its header, before anything decodes it (a small file can hold a huge image).
A request holds at most ``max_images_per_request`` image parts (checked before any is read) whose
bytes total at most ``max_image_bytes_per_request`` (checked as each is read, before the next).

:func:`load_images` runs where the worker builds a chunk's requests (in threads, up to 8 requests'
images read at once, under the job's storage policy): a request with image parts gets them as
:class:`LoadedImage` s (``images``, in the order of the parts); a record whose image cannot be
loaded gets that as its error. The engines take
them from there: vLLM and transformers as decoded images (:meth:`LoadedImage.pil`) beside the chat
template's rendering of :func:`template_messages`, the ``openai`` engine as ``data:`` URLs
(:func:`openai_messages`).

The batcher's token estimate (:func:`estimate_prompt_tokens`) counts the text parts' characters / 4
and each image's :func:`image_tokens`.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from airflow_batchinfer.exceptions import StorageError
from airflow_batchinfer.storage.bounded_read import read_bounded
from airflow_batchinfer.storage.location import StorageOptions

if TYPE_CHECKING:
    from airflow_batchinfer.engines.base import GenerationRequest

DEFAULT_MAX_IMAGE_BYTES = 20 * 1024 * 1024
DEFAULT_MAX_IMAGE_PIXELS = 40_000_000
DEFAULT_MAX_IMAGES_PER_REQUEST = 8
DEFAULT_MAX_IMAGE_BYTES_PER_REQUEST = 64 * 1024 * 1024
DETAILS = ("auto", "low", "high")
# image_tokens: a 28-pixel cell per token (14-pixel ViT patches merged 2x2, as Qwen2-VL counts),
# plus its start and end markers; at most what Qwen2.5-VL gives one image by default
_CELL = 28
_MAX_IMAGE_TOKENS = 16_384
UNKNOWN_IMAGE_TOKENS = 1_024  # an image part not loaded (its size unknown)
_MIME = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}
#: The schemes an image URL may name besides ``data:`` and an absolute path: local files and object
#: stores (whose endpoint is the deployment's, never the record's); web and chained URLs never.
READABLE_SCHEMES = ("file", "s3", "s3a", "gs", "gcs", "abfs", "abfss", "az")


class ImageError(ValueError):
    """An image part that cannot be sent: the message says which and why (the record's error)."""


@dataclass(frozen=True)
class ImageLimits:
    """The caps the deployment pins on each image (worker settings ``max_image_bytes`` and
    ``max_image_pixels``) and on each request's images (``max_images_per_request``,
    ``max_image_bytes_per_request``: what one record may keep in the worker's memory)."""

    max_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    max_images: int = DEFAULT_MAX_IMAGES_PER_REQUEST
    max_request_bytes: int = DEFAULT_MAX_IMAGE_BYTES_PER_REQUEST


@dataclass(frozen=True)
class LoadedImage:
    """An image part's bytes (PNG, JPEG or WebP), its size from its header, its ``detail``."""

    data: bytes
    format: str  # png | jpeg | webp
    width: int
    height: int
    detail: str = "auto"

    @property
    def mime(self) -> str:
        return _MIME[self.format]

    def data_url(self) -> str:
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode()}"

    def tokens(self) -> int:
        return image_tokens(self.width, self.height)

    def pil(self) -> Any:
        """The decoded image, in RGB (needs Pillow: the ``transformers`` and ``vllm`` extras have it)."""
        import io

        from PIL import Image

        with Image.open(io.BytesIO(self.data)) as img:
            if img.size != (self.width, self.height):  # a header that lied to the caps' check
                raise ImageError(f"image decodes to {img.size}, its header said {self.width}x{self.height}")
            return img.convert("RGB")


def image_tokens(width: int, height: int) -> int:
    """The estimate of one image's prompt tokens: ``ceil(w/28) * ceil(h/28) + 2`` (a token per
    28x28 cell, Qwen2-VL's count, and two markers), at most 16,384. Models differ (LLaVA-1.5 gives
    every image 576 tokens); the batcher sizes batches by it, nothing is refused by it."""
    return min(math.ceil(width / _CELL) * math.ceil(height / _CELL) + 2, _MAX_IMAGE_TOKENS)


# ------------------------------------------------------------------------------------------- parts
def parts(content: Any, where: str = "content") -> list[Mapping[str, Any]]:
    """The content parts of a message's ``content`` (a string: one text part), checked: each a
    ``text`` part with a string ``text`` or an ``image_url`` part with a string ``url`` and a
    ``detail`` of auto, low or high; :class:`ImageError` naming the part otherwise."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise ImageError(f"{where} must be a string or a list of content parts, got {type(content).__name__}")
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise ImageError(f"{where}[{i}]: a text part needs a string 'text'")
        elif kind == "image_url":
            image = part.get("image_url")
            if not (isinstance(image, Mapping) and isinstance(image.get("url"), str)):
                raise ImageError(f'{where}[{i}]: an image_url part needs "image_url": {{"url": "..."}}')
            if image.get("detail", "auto") not in DETAILS:
                raise ImageError(f"{where}[{i}]: detail must be one of {', '.join(DETAILS)}")
        else:
            raise ImageError(
                f"{where}[{i}]: content part type {kind!r} is refused: only text and image_url parts are "
                "read (audio, files and others: not supported)"
            )
    return list(content)


def has_images(messages: Sequence[Mapping[str, Any]] | None) -> bool:
    """Whether any message's content is a list holding an ``image_url`` part (unchecked)."""
    for m in messages or ():
        content = m.get("content")
        if isinstance(content, list) and any(
            isinstance(p, Mapping) and p.get("type") == "image_url" for p in content
        ):
            return True
    return False


def text_chars(messages: Sequence[Mapping[str, Any]] | None) -> int:
    """The characters of the messages' text (a string content, or its text parts)."""
    total = 0
    for m in messages or ():
        content = m.get("content")
        if isinstance(content, list):
            total += sum(len(str(p.get("text", ""))) for p in content if isinstance(p, Mapping))
        elif content is not None:
            total += len(str(content))
    return total


def image_urls(messages: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """Each image part's ``(url, detail)``, in order (:class:`ImageError` for a malformed part)."""
    out = []
    for n, m in enumerate(messages):
        for p in parts(m.get("content"), f"messages[{n}].content"):
            if p["type"] == "image_url":
                out.append((str(p["image_url"]["url"]), str(p["image_url"].get("detail", "auto"))))
    return out


def estimate_prompt_tokens(
    messages: Sequence[Mapping[str, Any]] | None, images: Sequence[LoadedImage] = ()
) -> int:
    """The batcher's estimate of a chat request's prompt tokens: its text's characters // 4 + 1, and
    each image's :func:`image_tokens` (an image part not loaded: :data:`UNKNOWN_IMAGE_TOKENS`)."""
    text = text_chars(messages) // 4 + 1
    if images:
        return text + sum(i.tokens() for i in images)
    unloaded = sum(
        1
        for m in messages or ()
        if isinstance(m.get("content"), list)
        for p in m["content"]
        if isinstance(p, Mapping) and p.get("type") == "image_url"
    )
    return text + unloaded * UNKNOWN_IMAGE_TOKENS


# ----------------------------------------------------------------------------------------- loading
def sniff(data: bytes) -> tuple[str, int, int]:
    """``(format, width, height)`` of PNG, JPEG or WebP ``data`` from its header (nothing decoded);
    :class:`ImageError` for another format or a header that cannot be read."""
    if data.startswith(b"\x89PNG\r\n\x1a\n") and data[12:16] == b"IHDR":
        return "png", int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if data.startswith(b"\xff\xd8"):
        return ("jpeg", *_jpeg_size(data))
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return ("webp", *_webp_size(data))
    raise ImageError("not a PNG, JPEG or WebP image (the formats images are read in)")


def _jpeg_size(data: bytes) -> tuple[int, int]:
    i = 2
    while i + 9 <= len(data):
        if data[i] != 0xFF:
            break
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if 0xD0 <= marker <= 0xD9 or marker == 0x01:  # markers without a length
            i += 2
            continue
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # a start of frame
            return int.from_bytes(data[i + 7 : i + 9], "big"), int.from_bytes(data[i + 5 : i + 7], "big")
        i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
    raise ImageError("a JPEG whose size cannot be read (no frame header)")


def _webp_size(data: bytes) -> tuple[int, int]:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30:
        return int.from_bytes(data[26:28], "little") & 0x3FFF, int.from_bytes(data[28:30], "little") & 0x3FFF
    if chunk == b"VP8L" and len(data) >= 25:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(data) >= 30:
        return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    raise ImageError("a WebP whose size cannot be read")


def _decode_data_url(url: str, max_bytes: int) -> bytes:
    head, comma, payload = url.partition(",")
    if not comma or not head.endswith(";base64") or not head[len("data:") :].startswith("image/"):
        raise ImageError("a data: URL must be data:image/<png|jpeg|webp>;base64,<data>")
    if len(payload) > 4 * math.ceil(max_bytes / 3) + 4:  # bounded before decoding
        raise ImageError(f"its data: URL holds more than {max_bytes} bytes (the worker's max_image_bytes)")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageError(f"its data: URL is not valid base64: {exc}") from None
    if len(data) > max_bytes:
        raise ImageError(f"its data: URL holds more than {max_bytes} bytes (the worker's max_image_bytes)")
    return data


def _check_scheme(url: str) -> None:
    """Refuse a URL the worker must not read, whatever its prefix policy allows (``--allow-any-prefix``
    allows every prefix, not every protocol): anything but an absolute path, ``file://`` or an object
    store's URI (:data:`READABLE_SCHEMES`), and any fsspec chain (``::``: ``simplecache::http://...``
    would fetch from the web)."""
    if "::" in url:
        raise ImageError("chained URLs (::) are refused: name the image by one storage URI or path")
    scheme, sep, _ = url.partition("://")
    if url.startswith("/") and not sep:
        return
    if not sep or scheme.lower() not in READABLE_SCHEMES:
        if not sep:
            what = "a relative path is refused"
        elif scheme.lower() in ("http", "https"):
            what = "http(s) image URLs are refused: a worker fetches nothing from the web"
        else:
            what = f"{scheme}:// image URLs are refused"
        stores = ", ".join(f"{s}://" for s in READABLE_SCHEMES if s != "file")
        raise ImageError(
            f"{what}; name an image by a data: URL, an absolute path, file:// or an object store's URI "
            f"({stores}) inside the allowed prefixes"
        )


def load_image(
    url: str, limits: ImageLimits, storage_options: StorageOptions | None = None, detail: str = "auto"
) -> LoadedImage:
    """The image ``url`` names, checked against ``limits`` (:class:`ImageError` saying why not). A
    path or storage URI is read under the job's storage policy (held by the caller's context)."""
    if url[:5].lower() == "data:":
        data = _decode_data_url(url, limits.max_bytes)
    else:
        _check_scheme(url)
        try:
            data = read_bounded(url, limits.max_bytes, storage_options)
        except StorageError as exc:
            raise ImageError(str(exc)) from None
    fmt, width, height = sniff(data)
    if width <= 0 or height <= 0:
        raise ImageError(f"a {fmt} of {width}x{height} pixels")
    if width * height > limits.max_pixels:
        raise ImageError(
            f"{width}x{height} is {width * height} pixels, above the worker's max_image_pixels "
            f"{limits.max_pixels}: send it smaller"
        )
    return LoadedImage(data, fmt, width, height, detail)


def _shown(url: str) -> str:
    return url[:40] + "..." if len(url) > 40 else url


def load_images(
    request: GenerationRequest, limits: ImageLimits, storage_options: StorageOptions | None = None
) -> GenerationRequest:
    """``request`` with its image parts loaded (``images``, in order); unchanged without any.
    :class:`ImageError` naming the part and the reason when one cannot be loaded."""
    if not has_images(request.messages) or request.images:
        return request
    urls = image_urls(request.messages or ())
    if len(urls) > limits.max_images:
        raise ImageError(
            f"{len(urls)} image parts, above the worker's max_images_per_request {limits.max_images}: "
            "split the record's images across records, or raise the worker's cap"
        )
    images: list[LoadedImage] = []
    held = 0  # at most max_image_bytes_per_request (+ one image's max_image_bytes being read)
    for n, (url, detail) in enumerate(urls):
        try:
            image = load_image(url, limits, storage_options, detail)
        except ImageError as exc:
            raise ImageError(f"image {n + 1} ({_shown(url)}): {exc}") from None
        held += len(image.data)
        if held > limits.max_request_bytes:
            raise ImageError(
                f"image {n + 1} ({_shown(url)}): the request's images hold {held} bytes up to it, above the "
                f"worker's max_image_bytes_per_request {limits.max_request_bytes}: send fewer or smaller "
                "images per record, or raise the worker's cap"
            )
        images.append(image)
    return replace(request, images=tuple(images))


# ------------------------------------------------------------------------------- for the engines
def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The messages as Hugging Face chat templates take images: each image part ``{"type":
    "image"}`` (the template writes the model's image placeholder there), text parts as they are."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = [{"type": "image"} if p.get("type") == "image_url" else dict(p) for p in content]
        out.append({**m, "content": content})
    return out


def openai_messages(
    messages: Sequence[Mapping[str, Any]], images: Sequence[LoadedImage]
) -> list[dict[str, Any]]:
    """The messages for an OpenAI-compatible server: each image part's URL a ``data:`` URL of the
    loaded image (the server cannot read the worker's storage), its ``detail`` kept."""
    loaded = iter(images)
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = [
                {**p, "image_url": {**p["image_url"], "url": next(loaded).data_url()}}
                if p.get("type") == "image_url"
                else p
                for p in content
            ]
        out.append({**m, "content": content})
    return out


def refused_images(engine: str, why: str) -> str:
    """The error of a request with images on an engine or model that takes none."""
    return (
        f"{engine}: this request has image parts, and {why}: send it to a pool serving a "
        "vision-language model"
    )
