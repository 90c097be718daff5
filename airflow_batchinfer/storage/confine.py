"""The storage prefixes a worker's job may use, held for as long as the job runs (docs/security.md).

A worker checks a job's input and outputs against its allow-list when the job is submitted, but a
directory on the way can be swapped for a symlink afterwards. So the worker's job runner sets the
job's policy here (:func:`confined`; the asyncio tasks and ``to_thread`` calls of the job inherit
it), and the storage layer checks every local file it opens, creates or renames for the job at that
moment: the path before anything is created (:func:`check_path`) and, on Linux, the file or
directory the kernel actually opened (:func:`check_opened`, by ``/proc/self/fd``), so a swap between
the check and the open is caught too. One check per file, never per record. Remote stores have no
symlinks (their keys are compared literally at submit): nothing is checked for them here.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Protocol

from airflow_batchinfer.exceptions import StorageError

if TYPE_CHECKING:
    from airflow_batchinfer.storage.location import Location


class HasFileno(Protocol):
    def fileno(self) -> int: ...


class Policy(Protocol):
    """What :class:`~airflow_batchinfer.worker.security.PrefixPolicy` offers (storage does not
    import the worker)."""

    def why_not(self, uri: str) -> str | None: ...
    def describe(self) -> str: ...


_POLICY: ContextVar[Policy | None] = ContextVar("batchinfer_job_policy", default=None)


@contextlib.contextmanager
def confined(policy: Policy | None) -> Iterator[None]:
    """Hold ``policy`` for the local files opened in this context (``None``: no check)."""
    token = _POLICY.set(policy)
    try:
        yield
    finally:
        _POLICY.reset(token)


def active() -> bool:
    """Whether a job's policy is held here (the local writers then pin their directory)."""
    return _POLICY.get() is not None


def refusal(uri: str) -> str | None:
    """Why the job's policy refuses ``uri``, a location a record names (an image part's), which no
    submit check saw: the reason and the allowed prefixes; ``None``: allowed, or no policy held."""
    policy = _POLICY.get()
    if policy is None or (reason := policy.why_not(uri)) is None:
        return None
    return f"{reason} (allowed: {policy.describe()}; a worker reads only inside its --allow-prefix)"


def check_path(path: str, uri: str) -> None:
    """Refuse a local ``path`` (about to be created, opened or renamed for ``uri``) that resolves
    outside the job's prefixes now (a :class:`StorageError` naming both)."""
    policy = _POLICY.get()
    if policy is not None and (reason := policy.why_not(path)) is not None:
        raise _refused(policy, uri, reason)


def check_opened(fd: int, path: str, uri: str, name: str = "") -> None:
    """Refuse local file ``path`` (for ``uri``) when the open ``fd`` lies outside the job's prefixes:
    ``fd`` is the file itself, or with ``name`` its directory (``name`` the file's name in it). Checks
    where the kernel opened it where that is known (Linux), else ``path`` as it resolves now."""
    policy = _POLICY.get()
    if policy is None:
        return
    opened = opened_path(fd)
    target = path if opened is None else os.path.join(opened, name) if name else opened
    if (reason := policy.why_not(target)) is not None:
        raise _refused(policy, uri, reason)


def check_file(file: HasFileno, loc: Location) -> None:
    """:func:`check_opened` for a file just opened at ``loc`` for reading, before its first byte is
    read: only a local file, only under a job's policy (a remote file object has no descriptor)."""
    if loc.is_local and active():
        check_opened(file.fileno(), loc.path, loc.uri)


def opened_path(fd: int) -> str | None:
    """The path the kernel has for an open ``fd`` (``None`` where ``/proc`` does not say)."""
    try:
        path = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None
    return path if path.startswith("/") else None  # "pipe:[…]", "anon_inode:…": not a path


def _refused(policy: Policy, uri: str, reason: str) -> StorageError:
    return StorageError(
        f"{uri}: refused while the job ran: {reason} (allowed: {policy.describe()}). It was inside "
        "them when the job was submitted, so a directory on its path was replaced since (by a symlink "
        "or a move); no file there was read, written or removed, though a write may have left the "
        "empty directories it makes on the way. Restore the directory, then retry the shard."
    )
