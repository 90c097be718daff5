"""Who may call a worker and what storage it may touch."""

from __future__ import annotations

import hmac
import ipaddress
import os
import posixpath

from airflow_batchinfer.exceptions import ConfigError


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def token_ok(header: str | None, token: str) -> bool:
    """Constant-time check of an ``Authorization: Bearer <token>`` header."""
    if not header or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[len("Bearer ") :].encode(), token.encode())


def normalize(uri: str) -> str:
    """A canonical form for prefix checks: absolute local paths, ``..`` resolved, no trailing slash."""
    head, sep, rest = uri.partition("://")
    if not sep:
        return os.path.abspath(uri)
    if head.lower() == "file":
        return os.path.abspath(rest)
    return f"{head.lower()}://{posixpath.normpath('/' + rest).lstrip('/')}"


class PrefixPolicy:
    """Allows a URI only under one of ``prefixes`` (``None``: anything, by explicit choice)."""

    def __init__(self, prefixes: list[str] | None) -> None:
        if prefixes is not None and not prefixes:
            raise ConfigError(
                "no storage prefix allowed: pass --allow-prefix (repeatable) for the locations jobs may "
                "read and write, or --allow-any-prefix to allow all (not for shared clusters)"
            )
        self.prefixes = None if prefixes is None else [normalize(p).rstrip("/") for p in prefixes]

    def allows(self, uri: str) -> bool:
        if self.prefixes is None:
            return True
        target = normalize(uri)
        return any(target == p or target.startswith(p + "/") for p in self.prefixes)
