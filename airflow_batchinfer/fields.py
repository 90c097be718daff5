"""The one shape of a setting's description, which every settings table of the package uses.

A :class:`Described` setting has its name, what it means (``help``: a flag's help, a param's
description, the docs' text), its type, its one default, the values it takes (``choices``,
``minimum``, ``maximum``) and where it shows up (``flag`` and ``metavar``; ``section``, the trigger
form's). Each table adds only what is its own, and its outputs derive from it:

- :class:`~airflow_batchinfer.spec.settings.Setting`: a run's settings (a run setting's from its
  ``RunConfig`` field): the DAG params, ``batchinfer run``'s flags and the docs' params table;
- :class:`~airflow_batchinfer.worker.settings.WorkerSetting`: ``batchinfer worker serve``'s flags
  and variables, ``WorkerConfig``'s defaults, the pools' worker command lines, the docs' table;
- :class:`~airflow_batchinfer.spec.limit_settings.LimitSetting` and
  :class:`~airflow_batchinfer.spec.limit_settings.PoolNetworkSetting`: the limits, the provider's
  ``[batchinfer]`` config section, the ``batchinfer_pool`` connection's form and the docs' tables;
- :class:`~airflow_batchinfer.review.bounds.DeskSetting`: the review desk's config keys;
- :class:`~airflow_batchinfer.engines.sampling.RequestField`: a request body's fields and the
  ``sampling`` param's schema.

Standard library only: ``get_provider_info`` reads the limits through it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Described:
    """One setting, described.

    :ivar name: its key: a param, a field, a config key, a flag's ``dest``.
    :ivar help: what it means.
    :ivar type: its type, in the words of its table (a JSON-schema type, a worker flag's kind, a
        limit's kind); ``None``: its table says it otherwise (a request field's schema).
    :ivar default: the one default (``None``: unset).
    :ivar choices: the values allowed (``()``: any of its type).
    :ivar minimum: the smallest number allowed.
    :ivar maximum: the largest number allowed.
    :ivar flag: its command-line flag (or a positional's name); ``None``: none.
    :ivar metavar: the flag's metavar.
    :ivar section: where a form shows it (the trigger form's section).
    """

    name: str
    help: str
    type: str | None = None
    default: Any = None
    choices: tuple[Any, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    flag: str | None = None
    metavar: str | None = None
    section: str | None = None

    def bounds_text(self) -> str:
        """The values it takes, in words (the docs' tables)."""
        out = []
        if self.choices:
            out.append("one of " + ", ".join(f"``{v}``" for v in self.choices))
        for value, word in ((self.minimum, "≥"), (self.maximum, "≤")):
            if value is not None:
                out.append(f"{word} {value}")
        return "; ".join(out)
