"""Atomic commit: a file exists complete, or not at all.

Local files are written under a hidden temporary name in the same directory and ``os.replace``-d
into place on commit, so readers never see a partial file and a re-run overwrites its own output.
Object stores (S3, GCS, ...) make an object visible only when its upload completes; an aborted
multipart upload is cancelled. A process killed mid-write can leave a hidden ``.*.tmp-*`` file
(local) or an incomplete multipart upload (S3, reclaimed by a bucket lifecycle rule); neither is ever
listed as a shard, and :func:`remove_stale_temps` sweeps local leftovers.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from typing import Any, BinaryIO, cast

from airflow_batchinfer.storage.location import Location

_TEMP_RE = re.compile(r"^\..+\.tmp-[0-9a-f]{32}$")


def is_temp_name(name: str) -> bool:
    return bool(_TEMP_RE.match(name))


class AtomicSink:
    """A binary file handle whose content becomes visible at :meth:`commit` and never on :meth:`abort`."""

    def __init__(self, loc: Location) -> None:
        self.loc = loc
        self._done = False
        self._temp: str | None = None
        if loc.is_local:
            directory, name = os.path.split(loc.path)
            os.makedirs(directory, exist_ok=True)
            self._temp = os.path.join(directory, f".{name}.tmp-{uuid.uuid4().hex}")
            self.file: BinaryIO = open(self._temp, "wb")  # noqa: SIM115 - closed in commit/abort
        else:
            self.file = cast(BinaryIO, loc.fs.open(loc.path, "wb"))

    def write(self, data: bytes) -> None:
        try:
            self.file.write(data)
        except OSError as exc:
            raise _naming(exc, self.loc.uri) from exc

    def commit(self) -> None:
        if self._done:
            return
        self._done = True
        try:
            if self._temp is not None:
                try:
                    self.file.flush()
                    os.fsync(self.file.fileno())
                    self.file.close()
                    os.replace(self._temp, self.loc.path)
                except BaseException:
                    self._discard_local()
                    raise
            else:
                self.file.close()  # completes the upload; only now does the object exist
        except OSError as exc:
            raise _naming(exc, self.loc.uri) from exc

    def abort(self) -> None:
        if self._done:
            return
        self._done = True
        if self._temp is not None:
            self._discard_local()
            return
        f: Any = self.file
        with contextlib.suppress(Exception):
            discard = getattr(f, "discard", None)
            if callable(discard):
                discard()  # s3fs: aborts the multipart upload; nothing becomes visible
            # Mark closed without close(): close() would upload what was buffered.
            f.closed = True

    def _discard_local(self) -> None:
        assert self._temp is not None
        with contextlib.suppress(OSError):
            self.file.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._temp)


def _naming(exc: OSError, uri: str) -> OSError:
    """``exc`` with the file it was writing (a full disk's ``ENOSPC`` names none by itself)."""
    if exc.filename:
        return exc
    return type(exc)(exc.errno, exc.strerror or str(exc), uri)


def remove_stale_temps(loc: Location) -> int:
    """Delete leftover temporary files of killed local writers in a directory; returns how many."""
    if not loc.is_local or not os.path.isdir(loc.path):
        return 0
    removed = 0
    for name in os.listdir(loc.path):
        if is_temp_name(name):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(loc.path, name))
                removed += 1
    return removed
