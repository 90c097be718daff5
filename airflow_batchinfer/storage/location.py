"""Storage locations: a URI (plain path, ``file://``, ``s3://bucket/prefix`` or any fsspec protocol)
plus the options that open it.

Credentials on the worker side come from the environment (IRSA, ``AWS_*`` variables, including
``AWS_ENDPOINT_URL`` for S3-compatible servers); pass ``storage_options`` (for S3: ``key``,
``secret``, ``token``, ``endpoint_url``, ``client_kwargs``) to set them explicitly. On the Airflow side
:func:`airflow_batchinfer.hooks.aws.storage_options_from_aws_conn` builds them from a connection.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import fsspec
from fsspec.spec import AbstractFileSystem

StorageOptions = Mapping[str, Any]


def _protocol(uri: str) -> str:
    head, sep, _ = uri.partition("://")
    return head.lower() if sep else "file"


@dataclass(frozen=True)
class Location:
    """A resolved URI: the filesystem that serves it and the path inside that filesystem."""

    uri: str
    fs: AbstractFileSystem = field(repr=False, compare=False)
    path: str

    @property
    def is_local(self) -> bool:
        return _protocol(self.uri) == "file"

    @property
    def name(self) -> str:
        return posixpath.basename(self.path.rstrip("/"))

    def at(self, uri: str) -> Location:
        """Another URI on this location's filesystem (a part of an input this is the root of)."""
        return Location(uri, self.fs, uri if self.is_local else self.fs._strip_protocol(uri))

    def child(self, name: str) -> Location:
        return Location(join(self.uri, name), self.fs, posixpath.join(self.path, name))


def resolve(uri: str, storage_options: StorageOptions | None = None) -> Location:
    """Resolve ``uri`` to a :class:`Location`. Local paths become absolute."""
    if not uri:
        raise ValueError("empty storage URI: pass a path, file:// or s3://bucket/prefix")
    if _protocol(uri) == "file":
        path = os.path.abspath(uri[len("file://") :] if uri.startswith("file://") else uri)
        fs = fsspec.filesystem("file")
        return Location(path, fs, path)
    fs, path = fsspec.core.url_to_fs(uri, **dict(storage_options or {}))
    return Location(uri.rstrip("/"), fs, path)


def join(uri: str, *parts: str) -> str:
    """Join path parts onto a URI with ``/`` (whatever the protocol)."""
    out = uri.rstrip("/")
    for part in parts:
        out = f"{out}/{part.strip('/')}"
    return out


def parent(uri: str) -> str:
    """The URI one level up (``s3://b/run/input`` → ``s3://b/run``)."""
    head, sep, rest = uri.rstrip("/").partition("://")
    if not sep:
        return os.path.dirname(os.path.abspath(uri))
    return f"{head}://{posixpath.dirname(rest)}"
