"""How much the review desk returns at once: its settings, described once, and the cut of one text.

The desk runs inside Airflow's api-server, and a round's rows hold whatever the model and the input
wrote (a line may be many MiB). Its page, random-sample and find answers therefore show each text
up to :attr:`Bounds.field_bytes` and a page's samples up to :attr:`Bounds.page_bytes`; a text cut
short is read whole, on demand, through the desk's ``field`` endpoint, up to
:attr:`Bounds.whole_field_bytes`.

:data:`DESK_SETTINGS` is the one description of these settings: the provider's config section
(``[batchinfer]``, :mod:`~airflow_batchinfer.get_provider_info`), :class:`Bounds` and the docs'
table derive from it. Standard library only, and outside :mod:`airflow_batchinfer.review`:
``get_provider_info`` imports it in every Airflow process, which must not load the desk.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.fields import Described

KIB, MIB = 1024, 1024 * 1024
RECORD_FIELDS = 4  # a sample's record shows up to this many times field_bytes in all


@dataclass(frozen=True, kw_only=True)
class DeskSetting(Described):
    """One setting of the review desk (:class:`~airflow_batchinfer.fields.Described`): the
    ``[batchinfer]`` config key, its default and least value (bytes), and what it means."""

    type: str = "integer"
    default: int
    minimum: int


def _desk(name: str, default: int, minimum: int, help_: str) -> DeskSetting:
    return DeskSetting(name=name, default=default, minimum=minimum, help=help_)


DESK_SETTINGS: tuple[DeskSetting, ...] = (
    _desk("review_field_bytes", 16 * KIB, 256,
                "the most bytes (UTF-8) of one text a review desk answer shows: a sample's id, prompt, "
                "output, reason, error or status, or one field of its record (its JSON); a longer one "
                f"is cut there, named in the sample's `truncated` with its whole size, and read whole "
                f"through the desk's `field` endpoint. A record shows {RECORD_FIELDS} times this in "
                "all (the fields after that are left out: `truncated` names `record`)"),
    _desk("review_page_bytes", 8 * MIB, 64 * KIB,
                "the most bytes of samples (their JSON) one page or random sample of the review desk "
                "returns: a page stops before the sample that would pass it (`capped`; its cursor goes "
                "on from that sample), and always holds one"),
    _desk("review_whole_field_bytes", 16 * MIB, 64 * KIB,
                "the most bytes the review desk's `field` endpoint returns for one text read whole; a "
                "longer one is refused (413): read it from the round's rejected file in storage"),
)  # fmt: skip
_BY_NAME = {s.name: s for s in DESK_SETTINGS}


@dataclass(frozen=True)
class Bounds:
    """The desk's caps, in bytes (see :data:`DESK_SETTINGS`)."""

    field_bytes: int = _BY_NAME["review_field_bytes"].default
    page_bytes: int = _BY_NAME["review_page_bytes"].default
    whole_field_bytes: int = _BY_NAME["review_whole_field_bytes"].default

    @property
    def record_bytes(self) -> int:
        return RECORD_FIELDS * self.field_bytes

    @classmethod
    def from_options(cls, get: Callable[[str], Any], source: str = "[batchinfer]") -> Bounds:
        """The caps from a config section: ``get(name)`` is a setting's value (``None`` or empty:
        its default)."""
        values: dict[str, int] = {}
        for field in dataclasses.fields(cls):
            setting = _BY_NAME[f"review_{field.name}"]
            raw = get(setting.name)
            if raw is None or (isinstance(raw, str) and not raw.strip()):
                continue
            values[field.name] = _size(raw, setting, source)
        return cls(**values)


def _size(raw: Any, setting: DeskSetting, source: str) -> int:
    try:
        value = int(raw)
    except (TypeError, ValueError):
        value = None
    if value is None or value < setting.minimum:
        raise ConfigError(
            f"{source} {setting.name} = {raw!r}: expected a whole number of bytes >= {setting.minimum} "
            f"(default {setting.default}); fix or remove it and restart the api-server"
        )
    return value


def utf8_size(text: str) -> int:
    """The bytes ``text`` takes as UTF-8 (what every desk bound measures; lone surrogates count)."""
    return len(text.encode("utf-8", "surrogatepass"))


def clip(text: str, limit: int) -> tuple[str, int | None]:
    """``text`` cut to at most ``limit`` UTF-8 bytes (on a character boundary), and its whole size in
    bytes when it was cut (``None``: it fits)."""
    if len(text) * 4 <= limit:  # no character takes more than 4 bytes: it fits unmeasured
        return text, None
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text, None
    return data[:limit].decode("utf-8", "ignore"), len(data)


def json_text(value: Any) -> str:
    """A value as the JSON text a row holds it as (what a record field's size is measured on)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
