"""Whole-file operations on any storage location: exists, move, remove, list (local or fsspec)."""

from __future__ import annotations

import contextlib
import os
import posixpath
import shutil
from collections.abc import Iterable

from airflow_batchinfer.storage.location import StorageOptions, join, resolve


def exists(uri: str, so: StorageOptions | None) -> bool:
    """Whether a file exists at ``uri``."""
    loc = resolve(uri, so)
    return bool(loc.fs.isfile(loc.path))


def move(src: str, dst: str, so: StorageOptions | None) -> None:
    """Local: a rename (atomic); object stores: copy, then delete the source (redone if cut short)."""
    s, d = resolve(src, so), resolve(dst, so)
    if s.is_local:
        os.makedirs(os.path.dirname(d.path), exist_ok=True)
        os.replace(s.path, d.path)
        return
    s.fs.copy(s.path, d.path)
    with contextlib.suppress(FileNotFoundError):
        s.fs.rm(s.path)


def remove(uri: str, so: StorageOptions | None) -> bool:
    """Delete a file; ``True`` if it existed."""
    loc = resolve(uri, so)
    if not loc.fs.isfile(loc.path):
        return False
    with contextlib.suppress(FileNotFoundError):
        loc.fs.rm(loc.path)
    return True


def remove_all(folder: str, names: Iterable[str], so: StorageOptions | None) -> None:
    """Delete these files of ``folder``, those already gone included (one bulk request on S3)."""
    paths = [resolve(join(folder, n), so).path for n in names]
    if not paths:
        return
    loc = resolve(folder, so)
    if loc.is_local:
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        return
    with contextlib.suppress(FileNotFoundError):
        loc.fs.rm(paths)


def remove_others(folder: str, prefix: str, keep: set[str], so: StorageOptions | None) -> None:
    """Delete the files of ``folder`` whose names start with ``prefix``, but for those in ``keep``
    (URIs): what an earlier try of a rewrite made that this one does not."""
    for name in names(folder, so):
        uri = join(folder, name)
        if name.startswith(prefix) and uri not in keep:
            remove(uri, so)


def remove_tree(uri: str, so: StorageOptions | None) -> None:
    """Delete a folder and everything under it (nothing when it does not exist)."""
    loc = resolve(uri, so)
    if loc.is_local:
        shutil.rmtree(loc.path, ignore_errors=True)
        return
    with contextlib.suppress(FileNotFoundError):
        loc.fs.rm(loc.path, recursive=True)


def names(uri: str, so: StorageOptions | None) -> list[str]:
    """The names in a folder (none when it does not exist)."""
    loc = resolve(uri, so)
    try:
        return [posixpath.basename(str(p).rstrip("/")) for p in loc.fs.ls(loc.path, detail=False)]
    except FileNotFoundError:
        return []
