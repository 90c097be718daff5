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

from airflow_batchinfer.storage.confine import check_opened, check_path
from airflow_batchinfer.storage.location import Location

_TEMP_RE = re.compile(r"^\..+\.tmp-[0-9a-f]{32}$")


def is_temp_name(name: str) -> bool:
    return bool(_TEMP_RE.match(name))


class AtomicSink:
    """A binary file handle whose content becomes visible at :meth:`commit` and never on :meth:`abort`."""

    def __init__(self, loc: Location) -> None:
        self.loc = loc
        self._done = False
        self._temp: str | None = None  # local: the temporary file's name in the held directory
        self._dir_fd: int | None = None
        if loc.is_local:
            self.file: BinaryIO = self._open_local()
        else:
            self.file = cast(BinaryIO, loc.fs.open(loc.path, "wb"))

    def _open_local(self) -> BinaryIO:
        """The temporary file, created in the target's directory held open by fd: the commit renames
        it inside that same directory, wherever its path leads by then. Under a job's policy
        (:mod:`~airflow_batchinfer.storage.confine`) the path is checked before a directory is made
        (``makedirs`` follows symlinks) and the held directory once it is open."""
        directory, name = os.path.split(self.loc.path)
        check_path(self.loc.path, self.loc.uri)
        os.makedirs(directory, exist_ok=True)
        self._dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        temp = f".{name}.tmp-{uuid.uuid4().hex}"
        try:
            check_opened(self._dir_fd, self.loc.path, self.loc.uri, name)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                fd = os.open(temp, flags, 0o666, dir_fd=self._dir_fd)
            except OSError as exc:
                raise type(exc)(exc.errno, exc.strerror, os.path.join(directory, temp)) from exc
        except BaseException:
            self._close_dir()
            raise
        self._temp = temp
        return os.fdopen(fd, "wb")

    def _close_dir(self) -> None:
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None

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
                    self._replace_local()
                except BaseException:
                    self._discard_local()
                    raise
                self._close_dir()
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

    def _replace_local(self) -> None:
        """The final rename, inside the held directory. Under a job's policy both the path as it
        resolves now and the held directory (moved away, it goes along) must still be inside."""
        assert self._temp is not None and self._dir_fd is not None
        name = os.path.basename(self.loc.path)
        check_path(self.loc.path, self.loc.uri)
        check_opened(self._dir_fd, self.loc.path, self.loc.uri, name)
        try:
            os.replace(self._temp, name, src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd)
        except OSError as exc:  # name the target, not the bare temporary name
            raise type(exc)(exc.errno, exc.strerror, self.loc.path) from exc

    def _discard_local(self) -> None:
        assert self._temp is not None
        with contextlib.suppress(OSError):
            self.file.close()
        if self._dir_fd is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._temp, dir_fd=self._dir_fd)
        self._close_dir()


def _naming(exc: OSError, uri: str) -> OSError:
    """``exc`` with the file it was writing (a full disk's ``ENOSPC`` names none by itself)."""
    if exc.filename:
        return exc
    return type(exc)(exc.errno, exc.strerror or str(exc), uri)


def remove_stale_temps(loc: Location) -> int:
    """Delete leftover temporary files of killed local writers in a directory; returns how many."""
    if not loc.is_local or not os.path.isdir(loc.path):
        return 0
    check_path(loc.path, loc.uri)  # a job's sweep must not follow a swapped link out of its prefixes
    removed = 0
    for name in os.listdir(loc.path):
        if is_temp_name(name):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(loc.path, name))
                removed += 1
    return removed
