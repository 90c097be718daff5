"""Image parts: parsing, data: URLs, the caps, the storage confinement, the token estimate."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_batchinfer.engines import images
from airflow_batchinfer.engines.base import GenerationRequest, SamplingParams
from airflow_batchinfer.engines.images import ImageError, ImageLimits, image_tokens, load_image, load_images
from airflow_batchinfer.storage.confine import confined
from airflow_batchinfer.worker.security import PrefixPolicy
from tests.support.images import data_url, image_message, jpeg_header, png, webp_lossless_header

LIMITS = ImageLimits()


def test_parts_reads_strings_text_and_image_parts() -> None:
    assert images.parts("hi") == [{"type": "text", "text": "hi"}]
    given = [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x", "detail": "low"}}]
    assert images.parts(given) == given


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (5, "a string or a list"),
        ([{"type": "text", "text": 1}], "content[0]: a text part needs a string 'text'"),
        ([{"type": "image_url", "image_url": "u"}], 'content[0]: an image_url part needs "image_url"'),
        ([{"type": "image_url", "image_url": {"url": "u", "detail": "max"}}], "detail must be one of"),
        ([{"type": "input_audio", "input_audio": {}}], "'input_audio' is refused"),
    ],
)
def test_parts_refuses_malformed_content(content: object, said: str) -> None:
    with pytest.raises(ImageError, match=said.replace("(", r"\(").replace("[", r"\[")):
        images.parts(content)


def test_sniff_reads_png_jpeg_webp_sizes_from_headers() -> None:
    assert images.sniff(png(7, 3)) == ("png", 7, 3)
    assert images.sniff(jpeg_header(640, 480)) == ("jpeg", 640, 480)
    assert images.sniff(webp_lossless_header(33, 17)) == ("webp", 33, 17)
    with pytest.raises(ImageError, match="not a PNG, JPEG or WebP"):
        images.sniff(b"GIF89a....")


def test_data_url_decodes_to_the_image() -> None:
    loaded = load_image(data_url(png(30, 20)), LIMITS, detail="high")
    assert (loaded.format, loaded.width, loaded.height, loaded.detail) == ("png", 30, 20, "high")
    assert loaded.data == png(30, 20)
    assert loaded.data_url() == data_url(png(30, 20))


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("data:text/plain;base64,aGk=", "data:image/<png|jpeg|webp>;base64"),
        ("data:image/png,rawbytes", "data:image/<png|jpeg|webp>;base64"),
        ("data:image/png;base64,@@@@", "not valid base64"),
        ("https://example.com/cat.png", "a worker fetches nothing from the web"),
        ("cat.png", "an absolute path"),
    ],
)
def test_bad_urls_are_refused_with_the_reason(url: str, said: str) -> None:
    with pytest.raises(ImageError, match=said.replace("|", r"\|")):
        load_image(url, LIMITS)


@pytest.mark.parametrize(
    "url",
    [
        "simplecache::http://127.0.0.1:9/x.png",
        "/tmp/a.png::http://127.0.0.1:9/x.png",
        "http://127.0.0.1:9/x.png",
        "HTTPS://127.0.0.1:9/x.png",
        "ftp://127.0.0.1:9/x.png",
        "memory://x.png",
        "github://o:r@main/x.png",
    ],
)
def test_web_and_chained_urls_are_refused_even_with_any_prefix_allowed(url: str) -> None:
    """``--allow-any-prefix`` allows every prefix, not every protocol: nothing is fetched."""
    refused = r"(image URLs|chained URLs \(::\)) are refused"
    with confined(PrefixPolicy(None)), pytest.raises(ImageError, match=refused):
        load_image(url, LIMITS)


def test_the_byte_cap_is_checked_before_decoding() -> None:
    big = data_url(png(64, 64))
    with pytest.raises(ImageError, match=r"more than 100 bytes .*max_image_bytes"):
        load_image(big, ImageLimits(max_bytes=100))


def test_the_pixel_cap_is_checked_from_the_header() -> None:
    with pytest.raises(ImageError, match="100x100 is 10000 pixels, above the worker's max_image_pixels 9999"):
        load_image(data_url(png(100, 100)), ImageLimits(max_pixels=9_999))
    # a JPEG header alone: its size is read without decoding anything
    with pytest.raises(ImageError, match="above the worker's max_image_pixels"):
        load_image(data_url(jpeg_header(20_000, 20_000), "image/jpeg"), LIMITS)


def test_paths_are_read_inside_the_allowed_prefixes_only(tmp_path: Path) -> None:
    inside, outside = tmp_path / "allowed", tmp_path / "elsewhere"
    inside.mkdir()
    outside.mkdir()
    (inside / "a.png").write_bytes(png(5, 4))
    (outside / "b.png").write_bytes(png(5, 4))
    with confined(PrefixPolicy([str(inside)])):
        assert load_image(str(inside / "a.png"), LIMITS).width == 5
        assert load_image(f"file://{inside}/a.png", LIMITS).height == 4
        with pytest.raises(ImageError, match=f"outside this worker's allowed prefixes .allowed: {inside}"):
            load_image(str(outside / "b.png"), LIMITS)
        # a symlink inside that leads outside is refused too
        (inside / "link.png").symlink_to(outside / "b.png")
        with pytest.raises(ImageError, match="outside this worker's allowed prefixes"):
            load_image(str(inside / "link.png"), LIMITS)
        with pytest.raises(ImageError, match="does not exist"):
            load_image(str(inside / "gone.png"), LIMITS)
        with pytest.raises(ImageError, match="larger than 10 bytes"):
            load_image(str(inside / "a.png"), ImageLimits(max_bytes=10))


def test_load_images_loads_each_part_in_order_and_names_the_failing_one(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(png(56, 28))
    messages = image_message(str(tmp_path / "a.png"))
    messages[0]["content"].append({"type": "image_url", "image_url": {"url": data_url(png(3, 3))}})  # type: ignore[attr-defined]
    request = GenerationRequest("r1", messages=messages)
    loaded = load_images(request, LIMITS)
    assert [(i.width, i.height) for i in loaded.images] == [(56, 28), (3, 3)]
    assert (
        load_images(GenerationRequest("r2", messages=[{"role": "user", "content": "hi"}]), LIMITS).images
        == ()
    )
    bad = GenerationRequest("r3", messages=[*messages, *image_message("http://x/y.png")])
    with pytest.raises(ImageError, match=r"image 3 \(http://x/y.png\): http\(s\) image URLs are refused"):
        load_images(bad, LIMITS)


def test_estimate_counts_text_parts_and_each_image_by_its_pixels() -> None:
    assert image_tokens(56, 28) == 2 * 1 + 2
    assert image_tokens(1000, 1000) == 36 * 36 + 2
    assert image_tokens(100_000, 100_000) == 16_384  # bounded
    text = "x" * 40  # 10 tokens
    request = GenerationRequest(
        "r", messages=image_message(data_url(png(280, 140)), text), sampling=SamplingParams(max_tokens=7)
    )
    # the image's data: URL is not counted as text (str(content) would have counted it)
    assert request.prompt_chars() == 40
    assert request.estimate_tokens() == 10 + 1 + images.UNKNOWN_IMAGE_TOKENS + 7
    assert load_images(request, LIMITS).estimate_tokens() == 10 + 1 + (10 * 5 + 2) + 7


def test_openai_messages_send_every_image_as_a_data_url(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(png(2, 2))
    request = load_images(GenerationRequest("r", messages=image_message(str(tmp_path / "a.png"))), LIMITS)
    sent = images.openai_messages(request.messages or (), request.images)
    assert sent[0]["content"][1] == {"type": "image_url", "image_url": {"url": data_url(png(2, 2))}}
    assert sent[0]["content"][0] == {"type": "text", "text": "what is this?"}


def test_template_messages_mark_each_image_for_the_chat_template() -> None:
    out = images.template_messages(image_message("data:x", "hi"))
    assert out[0]["content"] == [{"type": "text", "text": "hi"}, {"type": "image"}]


async def test_the_openai_engine_sends_a_loaded_path_as_a_data_url(tmp_path: Path) -> None:
    import json

    import httpx

    from airflow_batchinfer.engines.openai import OpenAIEngine

    sent: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        answer = {"message": {"role": "assistant", "content": "a red square"}, "finish_reason": "stop"}
        return httpx.Response(200, json={"choices": [answer], "usage": {"prompt_tokens": 9}})

    (tmp_path / "a.png").write_bytes(png(4, 4))
    messages = image_message(str(tmp_path / "a.png"))
    messages[0]["content"][1]["image_url"]["detail"] = "low"  # type: ignore[index]
    engine = OpenAIEngine(
        "m", base_url="http://llm.local/v1", api_key="k", transport=httpx.MockTransport(handler)
    )
    await engine.start()
    request = load_images(GenerationRequest("r", messages=messages), LIMITS)
    [out] = await engine.generate([request])
    await engine.close()
    assert out.text == "a red square"
    part = sent[0]["messages"][0]["content"][1]  # type: ignore[index]
    assert part == {"type": "image_url", "image_url": {"url": data_url(png(4, 4)), "detail": "low"}}


def test_a_storage_uri_outside_the_prefixes_is_refused_before_anything_is_read() -> None:
    # no S3 server here: a read would fail otherwise; the URI is refused by the rule itself first
    with confined(PrefixPolicy(["s3://bucket/images"])):
        with pytest.raises(
            ImageError, match=r"s3://bucket/secret/x.png is outside .*allowed: s3://bucket/images"
        ):
            load_image("s3://bucket/secret/x.png", LIMITS)
        with pytest.raises(ImageError, match=r"'\.\.' path segment is not allowed"):
            load_image("s3://bucket/images/../secret/x.png", LIMITS)


def test_a_requests_image_count_is_capped_before_any_is_read(tmp_path: Path) -> None:
    three = [str(tmp_path / "never-read.png"), data_url(png(3, 3)), data_url(png(3, 3))]
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}} for u in three]}]
    request = GenerationRequest("r1", messages=messages)
    with pytest.raises(ImageError, match="3 image parts, above the worker's max_images_per_request 2: split"):
        load_images(request, ImageLimits(max_images=2))
    with pytest.raises(ImageError, match=r"image 1 .* does not exist"):  # within the cap: read
        load_images(request, ImageLimits(max_images=3))


def test_a_requests_image_bytes_are_capped_before_the_next_is_read(tmp_path: Path) -> None:
    one = png(8, 8)
    (tmp_path / "c.png").write_bytes(one)
    urls = [data_url(one), data_url(one), str(tmp_path / "c.png")]
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}} for u in urls]}]
    gone = [
        {"role": "user", "content": [*messages[0]["content"], *image_message("/nowhere/d.png")[0]["content"]]}
    ]
    refused = r"image 3 \(.*\): the request.s images hold \d+ bytes up to it, above the worker.s "
    with pytest.raises(ImageError, match=refused + "max_image_bytes_per_request"):
        load_images(GenerationRequest("r1", messages=gone), ImageLimits(max_request_bytes=2 * len(one)))
    loaded = load_images(
        GenerationRequest("r2", messages=messages), ImageLimits(max_request_bytes=3 * len(one))
    )
    assert [i.width for i in loaded.images] == [8, 8, 8]
