"""Read-modify-write of one small file where concurrent writers lose nothing.

:func:`update` replaces a file with ``change(its current bytes)``; two processes updating the same
file at once both see their change land:

- a local disk: an ``flock`` on ``.<name>.lock`` beside the file serialises writers; the new file
  replaces the old atomically (a reader sees one or the other, never half);
- S3 (and S3-compatible servers that honour conditional writes, SeaweedFS and MinIO among them): a
  compare-and-swap on the object's ETag (``If-Match``; ``If-None-Match: *`` to create it); a writer
  that lost the race reads again and retries;
- any other fsspec store: a plain write (its last writer wins), so keep its writers to one process.
  What many processes write at once (run-owner claims, review decisions) calls :func:`require_exact`
  first and is refused there.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import time
from collections.abc import Callable, Iterator

from airflow_batchinfer.exceptions import ConfigError, StorageError
from airflow_batchinfer.storage.atomic import AtomicSink
from airflow_batchinfer.storage.location import Location

__all__ = ["exact", "read", "require_exact", "update"]

SAFE_STORES = (
    "a local disk of one host (the Airflow components that write it on that host), or S3 / an "
    "S3-compatible server with conditional writes (MinIO, SeaweedFS, Ceph)"
)

TRIES = 20  # compare-and-swap attempts before giving up (each after a short random wait)
_LOST_RACE = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}


def update(loc: Location, change: Callable[[bytes | None], bytes]) -> bytes:
    """Replace the file at ``loc`` with ``change(current)`` (``None`` when it does not exist yet);
    returns the file's bytes after the change. A ``change`` that returns ``current`` itself writes
    nothing. ``change`` may run more than once (again after a concurrent write), so it must only
    compute; an exception it raises leaves the file as it was."""
    if loc.is_local:
        with _flock(loc):
            current = read(loc)
            data = change(current)
            if data is current:
                return data
            sink = AtomicSink(loc)
            try:
                sink.write(data)
                sink.commit()
            finally:
                sink.abort()
            return data
    if not exact(loc):
        current = read(loc)
        data = change(current)
        if data is not current:
            loc.fs.pipe_file(loc.path, data)
        return data
    for attempt in range(TRIES):
        etag, current = _read_tagged(loc)
        data = change(current)
        if data is current:
            return data
        condition = {"IfMatch": etag} if etag is not None else {"IfNoneMatch": "*"}
        try:
            loc.fs.pipe_file(loc.path, data, **condition)
            return data
        except OSError as exc:
            if not _lost_race(exc):
                raise
        time.sleep(random.uniform(0.02, 0.1) * (attempt + 1))
    raise StorageError(
        f"{loc.uri}: {TRIES} concurrent writers in a row changed it while this one did; try again"
    )


def exact(loc: Location) -> bool:
    """Whether :func:`update` is exact at ``loc`` (a local disk or S3); elsewhere the last writer wins."""
    return loc.is_local or _is_s3(loc)


def require_exact(loc: Location, what: str) -> None:
    """Refuse ``what`` at ``loc`` unless :func:`update` is exact there: on a store without
    conditional writes two writers at once would silently lose one's change (a ``ConfigError``
    naming the store and the remedy; nothing is read or written)."""
    if exact(loc):
        return
    protocol = loc.fs.protocol
    name = "/".join(protocol) if isinstance(protocol, tuple | list) else str(protocol)
    raise ConfigError(
        f"{what} is refused: {loc.uri} is on a {name}:// store, which has no conditional writes, so "
        f"writers at the same instant would overwrite each other. Remedy: put the run root on {SAFE_STORES}."
    )


def _is_s3(loc: Location) -> bool:
    protocol = loc.fs.protocol
    return bool({"s3", "s3a"} & set(protocol if isinstance(protocol, tuple | list) else (protocol,)))


def read(loc: Location) -> bytes | None:
    """The file's bytes, ``None`` when it does not exist."""
    try:
        return bytes(loc.fs.cat_file(loc.path))
    except FileNotFoundError:
        return None


def _read_tagged(loc: Location) -> tuple[str | None, bytes | None]:
    """The object's ETag, then its bytes. In this order, bytes newer than the tag make the swap
    fail (the tag no longer matches), never succeed on a stale read."""
    try:
        etag = loc.fs.info(loc.path, refresh=True)["ETag"]
    except FileNotFoundError:
        return None, None
    current = read(loc)
    return (etag, current) if current is not None else (None, None)


def _lost_race(exc: OSError) -> bool:
    cause = exc.__cause__
    response = getattr(cause, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = str(response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    return code in _LOST_RACE or status in _LOST_RACE


@contextlib.contextmanager
def _flock(loc: Location) -> Iterator[None]:
    directory, name = os.path.split(loc.path)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f".{name}.lock"), "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
