"""Who may call a worker and what storage it may touch.

Nothing here imports Airflow: the Airflow side checks run params with the same :class:`PrefixPolicy`.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from urllib.parse import unquote

from airflow_batchinfer.exceptions import ConfigError

# Schemes that name the same storage (s3fs serves s3a:// as s3://; gcsfs gcs:// as gs://).
SCHEME_ALIASES = {"s3a": "s3", "s3n": "s3", "gcs": "gs"}


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


def _split(uri: str) -> tuple[str, tuple[str, ...]]:
    """``(scheme, segments)`` of ``uri`` as storage opens it; ``scheme`` is ``file`` for local paths.

    Raises :class:`ValueError` (with the reason) for a URI no prefix can allow.
    """
    if "::" in uri:
        raise ValueError(f"{uri}: fsspec URL chaining ('::') is not allowed")
    head, sep, rest = uri.partition("://")
    if not sep or head.lower() == "file":
        # As storage.location.resolve opens it: only a lowercase file:// is stripped; then symlinks
        # are resolved, so a link inside an allowed directory cannot lead outside it.
        path = os.path.realpath(uri[len("file://") :] if uri.startswith("file://") else uri)
        return "file", tuple(s for s in path.split(os.sep) if s)
    scheme = head.lower()
    scheme = SCHEME_ALIASES.get(scheme, scheme)
    segments = rest.split("/")
    for segment in segments:
        if unquote(segment) in (".", ".."):
            raise ValueError(
                f"{uri}: a {segment!r} path segment is not allowed in a {scheme}:// URI (storage uses "
                "the key literally, and HTTP layers may resolve it): name the object without it"
            )
    while segments and segments[-1] == "":  # s3://b/runs/ is the prefix s3://b/runs
        segments.pop()
    return scheme, tuple(segments)


def normalize(uri: str) -> str:
    """The canonical form prefix checks compare: a real absolute path for local paths (``file://``
    stripped, symlinks and ``..`` resolved), ``scheme://bucket/key`` for remote URIs (scheme lowercased,
    ``s3a`` → ``s3``, no trailing slash). :class:`ValueError` for a URI no prefix allows (``.``/``..``
    segments in a remote URI, fsspec ``::`` chaining)."""
    scheme, segments = _split(uri)
    if scheme == "file":
        return "/" + "/".join(segments)
    return f"{scheme}://" + "/".join(segments)


def is_path_model(ref: str) -> bool:
    """Whether a model reference names a local path (absolute, or ``file://``), not a name."""
    return ref.startswith(("/", "file://"))


def normalize_model(ref: str) -> str:
    """The form model allow-lists compare: a local path as :func:`normalize` makes it (real path,
    ``..`` and symlinks resolved); any other reference (``builtin:smollm2``, a hub id) as written.
    :class:`ValueError` for a name with a ``.`` or ``..`` segment: an engine may open it as a path
    relative to the worker's directory, which no allow-list entry can bound."""
    if is_path_model(ref):
        return normalize(ref)
    if any(segment in (".", "..") for segment in ref.split("/")):
        raise ValueError(
            f"{ref!r} has a '.' or '..' path segment: name a local model by its absolute path, or "
            "another model by its name as written"
        )
    return ref


def model_allows(entry: str, ref: str) -> bool:
    """Whether an allow-list ``entry`` admits model ``ref`` (:class:`ValueError` for a ``ref`` that
    :func:`normalize_model` refuses). Paths compare normalised, by whole segments: ``/models/``
    allows everything under ``/models``, ``/models/a`` only itself. Other references compare as
    written: equal, or under an entry ending in ``/``, ``:`` or ``.`` (``builtin:`` allows every
    built-in model). A path entry never admits a name, nor the reverse."""
    value = normalize_model(ref)
    if is_path_model(entry) != is_path_model(ref):
        return False
    if not is_path_model(entry):
        return value == entry or (entry[-1:] in ("/", ":", ".") and value.startswith(entry))
    try:
        allowed = normalize(entry)
    except ValueError:
        return False
    return value == allowed or (entry.endswith("/") and value.startswith(allowed.rstrip("/") + "/"))


class PrefixPolicy:
    """Allows a URI only under one of ``prefixes`` (``None``: anything, by explicit choice).

    The rules (the same on workers and on the Airflow side):

    - **Local paths** (plain or ``file://``): the prefix and the target are both resolved with
      :func:`os.path.realpath` (absolute, ``..`` and symlinks resolved), so a symlink inside an
      allowed directory that points outside is refused. A prefix that is itself a symlink allows
      where it points.
    - **Remote URIs** (``s3://``, ``gs://``, any fsspec scheme): compared literally, because s3fs sends
      the key as written (``s3://b/ok/../secret`` is the key ``ok/../secret``, and a proxy or
      S3-compatible server may resolve it). A URI with a ``.`` or ``..`` segment (also percent-encoded)
      is refused outright. The scheme is lowercased and ``s3a``/``s3n`` count as ``s3``, ``gcs`` as
      ``gs``.
    - **Boundaries are path segments**: ``s3://b/runs`` allows ``s3://b/runs`` and ``s3://b/runs/x``,
      not ``s3://b/runs2/x``; a trailing slash on a prefix changes nothing; ``s3://b`` allows the
      whole bucket. An empty segment counts (``s3://b//runs/x`` is not under ``s3://b/runs``).
    - fsspec URL chaining (``simplecache::s3://…``) is refused.

    :meth:`allows` answers yes or no; :meth:`why_not` gives the reason for a no.
    """

    def __init__(self, prefixes: list[str] | None) -> None:
        if prefixes is not None and not prefixes:
            raise ConfigError(
                "no storage prefix allowed: pass --allow-prefix (repeatable) for the locations jobs may "
                "read and write, or --allow-any-prefix to allow all (not for shared clusters)"
            )
        self.prefixes: list[tuple[str, tuple[str, ...]]] | None = None
        if prefixes is not None:
            self.prefixes = []
            for prefix in prefixes:
                try:
                    self.prefixes.append(_split(prefix))
                except ValueError as exc:
                    raise ConfigError(f"allowed prefix {exc}") from exc

    def why_not(self, uri: str) -> str | None:
        """``None`` when ``uri`` is allowed, else why not (names the URI)."""
        if self.prefixes is None:
            return None
        try:
            scheme, segments = _split(uri)
        except ValueError as exc:
            return str(exc)
        for p_scheme, p_segments in self.prefixes:
            if scheme == p_scheme and segments[: len(p_segments)] == p_segments:
                return None
        if scheme == "file":
            real = "/" + "/".join(segments)
            if os.path.abspath(uri[len("file://") :] if uri.startswith("file://") else uri) != real:
                return f"{uri} resolves to {real}, outside this worker's allowed prefixes"
        return f"{uri} is outside this worker's allowed prefixes"

    def allows(self, uri: str) -> bool:
        return self.why_not(uri) is None

    @property
    def confines(self) -> bool:
        """Whether any URI is refused (``False`` with ``--allow-any-prefix``)."""
        return self.prefixes is not None

    def describe(self) -> str:
        """The allowed prefixes as compared (real paths, canonical URIs), for error messages."""
        if self.prefixes is None:
            return "any prefix"
        return ", ".join(
            "/" + "/".join(s) if scheme == "file" else f"{scheme}://" + "/".join(s)
            for scheme, s in self.prefixes
        )
