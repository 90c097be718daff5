"""A stored input's version: what tells a rewritten input apart from the one a run planned over.

An object store's ``ETag`` changes with the bytes. A local file's ``mtime`` does not have to: a
rewrite of the same size whose mtime is set back (``cp -p``, ``rsync -t``, ``touch -r``) keeps size
and mtime. Its inode and ctime (fsspec's ``created``; the kernel sets it on every write and on every
change of the mtime, and nothing can set it back) do change, so a local file's version carries them
too. Versions recorded before they did (``size:mtime``, no :data:`LOCAL_MARK`) still match the file's
size and mtime: a run planned then resumes as it did.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

LOCAL_MARK = "@"  # between the version's tag and a local file's inode and ctime


def version_tag(info: Mapping[str, Any]) -> str:
    """``ETag``, else ``mtime`` (``LastModified``), then ``@inode:ctime`` for a local file."""
    tag = str(info.get("ETag") or info.get("mtime") or info.get("LastModified") or "")
    if not info.get("ETag") and info.get("ino") is not None and info.get("created") is not None:
        tag += f"{LOCAL_MARK}{info['ino']}:{info['created']!r}"
    return tag


def source_version(info: Mapping[str, Any]) -> str:
    """``size:tag`` (:func:`version_tag`): the version a range plan is valid for."""
    return f"{info.get('size')}:{version_tag(info)}"


def same_version(recorded: str, now: str) -> bool:
    """Whether the file is still the version ``recorded``: equal, or ``recorded`` is from before
    local versions carried inode and ctime and ``now`` differs only in them."""
    return recorded == now or (LOCAL_MARK not in recorded and now.split(LOCAL_MARK, 1)[0] == recorded)


def keep_recorded(fingerprint: dict[str, Any], recorded: Mapping[str, Any] | None) -> dict[str, Any]:
    """``fingerprint`` with the ``version`` that ``recorded`` (an earlier output's) holds where that
    is the same version (:func:`same_version`): an output made before local versions carried inode
    and ctime is still this input's."""
    was = (recorded or {}).get("version")
    if (
        isinstance(was, str)
        and was != fingerprint.get("version")
        and same_version(was, str(fingerprint.get("version")))
    ):
        return {**fingerprint, "version": was}
    return fingerprint
