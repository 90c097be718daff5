"""An oversized id found without parsing its line.

A line within ``max_line_bytes`` whose id is longer than ``max_id_bytes`` is bad; parsed whole
first, its record (the id as a ``str``, every other field too) held several times the line's bytes
before the id was refused. A long line (over :data:`SCAN_FROM` bytes) that may carry such an id (a
key that is, or may spell, the id field, followed by a string of more than ``max_id_bytes``
characters: a regular expression, in C) is scanned instead: its strings and brackets, to find the
top-level object's id key, and that key's string measured where it lies. Nothing of the line is
copied but that string, and only when it holds escapes. Any other line is parsed as before.

A top-level id key whose string is too long refuses the line even when the object repeats the key
(a JSON parser keeps the last value): one oversized id is enough.
"""

from __future__ import annotations

import functools
import re

import orjson

from airflow_batchinfer.storage.records import id_too_long

SCAN_FROM = 64 * 1024  # a shorter line is parsed whole: what its record holds stays small

_STRING_REST = rb'[^"\\]*+(?:\\.[^"\\]*+)*+"'  # a JSON string after its opening quote
# Whatever is not a bracket, strings whole: what a bracket count drops (C, no Python per token).
_NOT_BRACKET = re.compile(rb'"' + _STRING_REST + rb'|[^"{}\[\]]++', re.DOTALL)
_TAIL = re.compile(_STRING_REST, re.DOTALL)


@functools.lru_cache(maxsize=16)
def _candidate(id_field: str, max_bytes: int) -> re.Pattern[bytes]:
    """A key that is the id field as written plainly, or a short key with an escape (which may
    spell it: a character is at most 12 bytes of escapes), followed by a string of more than
    ``max_bytes`` units: a byte, or a backslash and the byte after it (a ``u`` escape is 5 units
    for at most 3 UTF-8 bytes, a newline's 1 for 1), so an id of more than ``max_bytes`` UTF-8 bytes
    has at least that many; :func:`_measure` measures each match. Its quote follows no backslash
    (an escaped quote starts no try), and every part is bounded or possessive: the search is linear
    in the line."""
    key = re.escape(orjson.dumps(id_field)[1:-1])
    most = 12 * len(id_field)
    escaped = rb'(?=[^"\\]{0,%d}\\)(?:[^"\\]|\\.){1,%d}' % (most, most)
    rest = rb'"\s*+:\s*+"(?=(?:[^"\\]|\\.){%d})' % (max_bytes + 1)
    return re.compile(rb'"(?<!\\")(?:' + key + rb"|" + escaped + rb")" + rest, re.DOTALL)


def oversized_id(line: bytes, id_field: str, max_bytes: int) -> str | None:
    """Why ``line`` is bad when its top-level object's ``id_field`` is a string of more than
    ``max_bytes`` UTF-8 bytes, found without parsing it (``None``: it is not, or ``line`` is short or
    not an object: parse it)."""
    if len(line) <= SCAN_FROM or line.lstrip()[:1] != b"{":
        return None
    plain = orjson.dumps(id_field)[1:-1]
    view = memoryview(line)
    depth, done = 0, 0
    # In valid JSON a match starts at a key (a string followed by a colon): the depth there is the
    # brackets before it, outside strings, counted from the last match on.
    for m in _candidate(id_field, max_bytes).finditer(line):
        brackets = _NOT_BRACKET.sub(b"", view[done : m.start()])
        depth += brackets.count(b"{") + brackets.count(b"[") - brackets.count(b"}") - brackets.count(b"]")
        done = m.start()
        key = _TAIL.match(line, m.start() + 1)  # the key's text, to its closing quote
        if depth != 1 or key is None or not _is_key(line, m.start() + 1, key.end() - 1, plain, id_field):
            continue
        tail = _TAIL.match(line, m.end())
        if tail is None:
            return None  # unterminated: invalid JSON, which the parse names
        why = _measure(line, m.end(), tail.end() - 1, id_field, max_bytes)
        if why is not None:
            return why
    return None


def _is_key(line: bytes, start: int, end: int, plain: bytes, id_field: str) -> bool:
    """Whether the key whose JSON text is ``line[start:end]`` spells ``id_field`` (escapes decoded
    only for a key short enough to: a character is at most 12 bytes of escapes)."""
    if end - start == len(plain) and line.startswith(plain, start):
        return True
    if line.find(b"\\", start, end) < 0 or end - start > 12 * len(id_field):
        return False
    try:
        return bool(orjson.loads(line[start - 1 : end + 1]) == id_field)
    except orjson.JSONDecodeError:
        return False


def _measure(line: bytes, start: int, end: int, id_field: str, max_bytes: int) -> str | None:
    """The refusal of a string id whose JSON text is ``line[start:end]`` when it is more than
    ``max_bytes`` UTF-8 bytes: the text's length without escapes, else a lower bound (an escape
    of at most 6 bytes is at least 1), else the decoded string's (copied: it holds escapes)."""
    escapes = line.count(b"\\", start, end)
    size, at_least = end - start - 5 * escapes, bool(escapes)
    if escapes and size <= max_bytes:
        try:
            size, at_least = (
                len(orjson.loads(line[start - 1 : end + 1]).encode("utf-8", "surrogatepass")),
                False,
            )
        except orjson.JSONDecodeError:
            return None  # the parse names what is wrong
    if size <= max_bytes:
        return None
    shown = line[start : min(end, start + 320)].decode("utf-8", "replace")
    return id_too_long(id_field, size, max_bytes, shown, at_least=at_least)
