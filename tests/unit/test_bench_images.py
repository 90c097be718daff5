"""bench/images.py's batch file: its PNGs are images the worker reads (their size from the header),
the same bytes on every run and different from each other; its bodies mix data: URLs, file:// paths
under the media folder, two images and none, as its docstring says."""

from __future__ import annotations

import base64
from pathlib import Path
from urllib.parse import unquote, urlparse

from airflow_batchinfer.engines.images import sniff
from bench.images import SIZES, bodies, image


def test_the_images_are_pngs_of_their_size_deterministic_and_distinct() -> None:
    made = [image(i) for i in range(200)]
    assert made == [image(i) for i in range(len(made))]
    assert len(set(made)) == len(made)
    assert {sniff(data)[1:] for data in made} == set(SIZES)
    assert all(sniff(data)[0] == "png" for data in made)


def test_the_bodies_mix_data_urls_paths_two_images_and_none(tmp_path: Path) -> None:
    lines = bodies(28, 8, tmp_path / "media")
    urls = {
        line["custom_id"]: [
            p["image_url"]["url"] for p in line["body"]["messages"][0]["content"] if p["type"] == "image_url"
        ]
        for line in lines
    }
    assert urls["img-6"] == [] and len(urls["img-4"]) == 2 and len(urls["img-0"]) == 1
    for cid, shown in urls.items():
        n = int(cid.split("-")[1])
        for k, url in enumerate(shown):
            if n % 4 == 3:
                path = Path(unquote(urlparse(url).path))
                assert url.startswith("file://") and path.parent == tmp_path / "media"
                data = path.read_bytes()
            else:
                data = base64.b64decode(url.removeprefix("data:image/png;base64,"))
            assert data == image(n + 28 * k)
    assert all(line["body"]["max_tokens"] == 8 and line["body"]["temperature"] == 0 for line in lines)
