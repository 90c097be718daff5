"""A sample's images (``/image``): the ``data:`` URL of an image part of its record, served as the
image so the page shows it as a thumbnail (lazily, scaled down by the page's CSS). The bytes come
from the record in the run's storage only: an image the record names by a path or ``s3://`` URI is
not served (the desk reads the run's root, nothing else), and its prompt line says where it is."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status
from fastapi.responses import Response

from airflow_batchinfer.engines.images import (
    DEFAULT_MAX_IMAGE_PIXELS,
    ImageError,
    ImageLimits,
    image_urls,
    load_image,
)
from airflow_batchinfer.review.routes.context import MAX_TEXT, round_of, run_context, view
from airflow_batchinfer.review.routes.host import AccessDep, ReadDag
from airflow_batchinfer.spec.limit_settings import CONFIG_SECTION

MAX_IMAGES = 1_000  # image parts of one record the route looks at
# only the image's own bytes, never a document: no script, no style, no sniffing into HTML
IMAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "private, max-age=3600",  # a closed round's rows do not change
}

router = APIRouter(prefix="/api/gates/{dag_id}/{run_id}", dependencies=[ReadDag])


@router.get("/image")
def sample_image(
    dag_id: str,
    run_id: str,
    access: AccessDep,
    shard: Annotated[str, Query(min_length=1, max_length=MAX_TEXT)],
    position: Annotated[int, Query(ge=0)],
    index: Annotated[int, Query(ge=1, le=MAX_IMAGES)],
    round: Annotated[int | None, Query(ge=0)] = None,
) -> Response:
    """Image ``index`` (from 1, as the prompt numbers them) of the sample at ``shard`` and
    ``position``: a PNG, JPEG or WebP ``data:`` URL of at most review_whole_field_bytes decoded
    bytes; 404 for no such image or one named by a path, 413 past the cap, 422 for one that is not
    such an image."""
    ctx = run_context(access, dag_id, run_id)
    r = round_of(ctx, round)
    found = view(ctx, r).at(shard, position)
    if found is None:
        where = f"{shard!r} position {position} in round {r}"
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no sample at {where}")
    body = found.record.get("body")
    messages = body.get("messages") if isinstance(body, dict) else None
    try:
        urls = image_urls(messages) if isinstance(messages, list) else []
    except ImageError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_ENTITY, f"the sample's messages: {exc}") from None
    if index > len(urls):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"the sample has {len(urls)} image(s), not {index}")
    url = urls[index - 1][0]
    if not url[:5].lower() == "data:":
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            f"image {index} is named by a path or URL: the desk serves only images inside the record "
            "(data: URLs); open it where it is stored",
        )
    cap = access.bounds().whole_field_bytes
    if len(url) > cap:  # its base64 alone: the decoded image is 3/4 of it
        raise HTTPException(
            413,  # content too large (its name in starlette changed across the versions we support)
            f"image {index}'s data: URL is {len(url)} bytes, more than [{CONFIG_SECTION}] "
            f"review_whole_field_bytes = {cap}: read it from the round's rejected file, or raise the setting",
        )
    try:
        image = load_image(url, ImageLimits(max_bytes=cap, max_pixels=DEFAULT_MAX_IMAGE_PIXELS))
    except ImageError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_ENTITY, f"image {index}: {exc}") from None
    return Response(image.data, media_type=image.mime, headers=IMAGE_HEADERS)
