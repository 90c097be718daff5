"""A whole small file a record names (an image part's ``s3://`` or local path), read by the worker
under the job's storage policy and a byte cap."""

from __future__ import annotations

from airflow_batchinfer.exceptions import StorageError
from airflow_batchinfer.storage import confine
from airflow_batchinfer.storage.location import StorageOptions, resolve


def read_bounded(uri: str, max_bytes: int, storage_options: StorageOptions | None = None) -> bytes:
    """The bytes of ``uri``: refused (a :class:`StorageError` saying why) when it lies outside the
    job's allowed prefixes (checked on the URI, then on the local file the kernel opened), is
    missing or unreadable, or holds more than ``max_bytes`` (never read past ``max_bytes`` + 1)."""
    if (why := confine.refusal(uri)) is not None:
        raise StorageError(why)
    try:
        loc = resolve(uri, storage_options)
        with loc.fs.open(loc.path, "rb") as f:
            confine.check_file(f, loc)
            data: bytes = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise StorageError(f"{uri} does not exist") from None
    except (OSError, ValueError) as exc:
        raise StorageError(f"{uri} cannot be read: {type(exc).__name__}: {exc}") from None
    except ImportError as exc:  # no filesystem for its scheme here (s3fs: the s3 extra)
        raise StorageError(f"{uri} cannot be read on this worker: {exc}") from None
    if len(data) > max_bytes:
        raise StorageError(f"{uri} is larger than {max_bytes} bytes (the worker's max_image_bytes)")
    return data
