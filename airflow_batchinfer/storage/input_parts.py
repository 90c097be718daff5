"""A run's ``input`` setting, parsed once: one file, a directory of part files (recursive) or a glob
of them, local, ``s3://`` or any fsspec URI (:func:`list_input`).

A directory or glob holds ``.jsonl``, ``.jsonl.zst`` (``.zstd``) or ``.parquet`` parts, all of one
format (Spark, Ray, Hugging Face layouts). Names starting with ``_`` or ``.`` (Spark's ``_SUCCESS``,
``_temporary/``, ``.crc`` files), anywhere under the root, are skipped; any other name is refused,
naming a few, so a stray file is never read as records. Parts come in natural order
(``part-10`` after ``part-9``), each pinned with its size and version
(:func:`~airflow_batchinfer.storage.file_version.source_version`) from the listing itself: one
paginated listing, no request per part. The version of the whole input
(:attr:`InputParts.version`) covers the part list, so a part added, removed or rewritten after
planning changes it.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.storage.file_version import source_version
from airflow_batchinfer.storage.lines import is_zstd
from airflow_batchinfer.storage.location import Location, StorageOptions, parent, resolve

Format = Literal["jsonl", "jsonl.zst", "parquet"]
InputKind = Literal["file", "dir", "glob"]
ACCEPTED = ".jsonl, .jsonl.zst (.zstd) or .parquet"
GLOB_CHARS = re.compile(r"[*?\[]")


def part_format(name: str) -> Format | None:
    """A part's format from its name (any case), ``None``: not a part."""
    low = name.lower()
    if low.endswith(".parquet"):
        return "parquet"
    if is_zstd(low) and low.rsplit(".", 2)[-2:-1] == ["jsonl"]:
        return "jsonl.zst"
    return "jsonl" if low.endswith(".jsonl") else None


def natural_key(name: str) -> list[Any]:
    """Sort key with digit runs compared as numbers (``part-10`` after ``part-9``)."""
    return [(1, int(t), t) if t.isdigit() else (0, t) for t in re.split(r"(\d+)", name)]


def skipped(rel: str) -> bool:
    """Whether a path under the input's root is not data: a name starting with ``_`` or ``.``."""
    return any(p.startswith(("_", ".")) for p in rel.split("/") if p)


@dataclass(frozen=True)
class Part:
    """One part file: its URI, stored size and version (as a range plan pins it)."""

    uri: str
    size: int
    version: str


@dataclass(frozen=True)
class InputParts:
    """The parsed ``input``: what was given (``uri``), how (``kind``), what its range shards name as
    their input (``root``: the directory or a glob's fixed prefix, every part under it; one file
    itself), the parts' ``format`` and the parts themselves in natural order (empty ones included:
    pinned, contributing nothing)."""

    uri: str
    kind: InputKind
    root: str
    format: Format
    parts: tuple[Part, ...]

    @property
    def single(self) -> bool:
        """One JSONL file given as such: planned exactly as before part inputs existed (a Parquet
        file is planned as parts are)."""
        return self.kind == "file" and self.format != "parquet"

    @property
    def size(self) -> int:
        return sum(p.size for p in self.parts)

    @property
    def version(self) -> str:
        """The version of the whole input: the part count and a hash of every part's name and version
        (a part added, removed or rewritten changes it). A single file's is its own."""
        if self.kind == "file":
            return self.parts[0].version
        h = hashlib.sha256()
        for p in self.parts:
            h.update(f"{p.uri}\t{p.version}\n".encode())
        return f"{len(self.parts)} parts:{h.hexdigest()[:32]}"


def input_prefix(uri: str) -> str:
    """A prefix every file ``uri`` names is under, without listing it: a glob's fixed directories,
    else the input's parent (what a local pool's workers are allowed to read)."""
    if not GLOB_CHARS.search(uri):
        return parent(uri)
    fixed = GLOB_CHARS.split(uri, 1)[0]
    return fixed[: fixed.rfind("/")] if "/" in fixed else parent(".")


def input_root(uri: str) -> str:
    """What the range shards of input ``uri`` name as their input (:attr:`InputParts.root`), without
    listing it: a glob's fixed directories, else ``uri`` itself (a directory, or one file). A prefix
    that allows reading ``uri`` allows the jobs' inputs and parts only under this (a glob's is not a
    prefix of them)."""
    return input_prefix(uri) if GLOB_CHARS.search(uri) else uri


def list_input(uri: str, storage_options: StorageOptions | None = None) -> InputParts:
    """``uri`` parsed and listed (see the module). Raises :class:`FileNotFoundError` when nothing is
    there, :class:`~airflow_batchinfer.exceptions.ConfigError` for mixed formats, unknown names in a
    directory or no parts, naming them and the remedy."""
    loc = resolve(uri, storage_options)
    if GLOB_CHARS.search(loc.path):
        root = _static_prefix(loc)
        found = loc.fs.glob(loc.path, detail=True)
        return _parts(loc, "glob", root, _files(found), uri)
    try:
        info = loc.fs.info(loc.path)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"input {uri} does not exist (a file, a directory of parts or a glob)"
        ) from None
    if info.get("type") != "directory":
        fmt = part_format(loc.name) or ("jsonl.zst" if is_zstd(loc.path) else "jsonl")
        part = Part(loc.uri, int(info.get("size") or 0), source_version(info))
        return InputParts(loc.uri, "file", loc.uri, fmt, (part,))
    return _parts(loc, "dir", loc.uri, _files(loc.fs.find(loc.path, detail=True)), uri)


def _files(found: Mapping[str, Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    return {path: info for path, info in found.items() if info.get("type") != "directory"}


def _uri(loc: Location, path: str) -> str:
    """The URI of ``path`` on ``loc``'s filesystem (a plain path locally)."""
    return path if loc.is_local else str(loc.fs.unstrip_protocol(path))


def _static_prefix(loc: Location) -> str:
    """The URI of the deepest directory of a glob without a wildcard."""
    fixed: list[str] = []
    for piece in loc.path.split("/"):
        if GLOB_CHARS.search(piece):
            break
        fixed.append(piece)
    return _uri(loc, "/".join(fixed) or "/")


def _parts(
    loc: Location, kind: InputKind, root: str, found: Mapping[str, Mapping[str, Any]], given: str
) -> InputParts:
    base = resolve(root, None).path if loc.is_local else loc.fs._strip_protocol(root)
    formats: dict[Format, list[str]] = {}
    unknown: list[str] = []
    parts: list[tuple[str, Part]] = []
    for path, info in found.items():
        rel = path[len(base) :].lstrip("/") if path.startswith(base) else posixpath.basename(path)
        if skipped(rel):
            continue
        fmt = part_format(rel)
        if fmt is None:
            unknown.append(rel)
            continue
        formats.setdefault(fmt, []).append(rel)
        parts.append((rel, Part(_uri(loc, path), int(info.get("size") or 0), source_version(info))))
    if unknown:
        unknown.sort(key=natural_key)
        raise ConfigError(
            f"input {given} holds {len(unknown)} file(s) that are not {ACCEPTED} parts "
            f"({', '.join(unknown[:3])}{', ...' if len(unknown) > 3 else ''}). Remedy: move them out, "
            "or give a glob that names the parts only (e.g. ending in /*.jsonl.zst); names starting "
            "with _ or . are skipped"
        )
    if len(formats) > 1:
        shown = "; ".join(
            f"{f}: {names[0]}" + (f" and {len(names) - 1} more" if len(names) > 1 else "")
            for f, names in sorted(formats.items())
        )
        raise ConfigError(
            f"input {given} mixes part formats ({shown}): one run reads one format. Remedy: give a "
            "glob of one format, or convert the others"
        )
    if not parts:
        raise ConfigError(
            f"input {given} holds no {ACCEPTED} parts (names starting with _ or . are skipped). "
            "Remedy: check the path, or give a glob that matches the parts"
        )
    parts.sort(key=lambda p: natural_key(p[0]))
    (only,) = formats
    return InputParts(loc.uri if kind == "dir" else given, kind, root, only, tuple(p for _, p in parts))
