"""LoRA adapters: the ``adapters`` run setting (``{name: directory}``), which adapter answers a
record, and the name a row is counted under (:class:`~airflow_batchinfer.state.tally.AdapterTally`).

A record names its adapter in its ``adapter`` field; an OpenAI batch request in its body's ``model``
(as ``vllm run-batch`` picks a LoRA adapter by the served model name). A record without one, or
whose ``adapter`` is :data:`BASE`, is answered by the base model (``fan_out``,
:mod:`~airflow_batchinfer.storage.fan_out`, runs every record once per adapter). An adapter is a
PEFT directory (``adapter_config.json`` and its weights) on the workers: the ``vllm`` engine loads
it as a ``LoRARequest`` (the pool started with the engine option ``enable_lora``), the
``transformers`` engine with ``peft``; each once per worker, cached.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.storage.fan_out import ADAPTER_FIELD, BASE

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@dataclass(frozen=True)
class Adapter:
    """One adapter of a run: its ``name`` (what records ask for) and its directory on the workers."""

    name: str
    path: str


def parse_adapters(value: Any, what: str = "adapters") -> dict[str, Adapter]:
    """The ``adapters`` setting, checked: names of letters, digits, ``. _ -``; each a local directory
    (the engines load adapters from the workers' disks, not from object storage)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f'{what} must be an object {{"name": "/path/to/adapter"}}, got {value!r}')
    out: dict[str, Adapter] = {}
    for name, path in value.items():
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ConfigError(
                f"{what}: adapter name {name!r} must be 1 to 64 letters, digits, '.', '_' or '-', starting "
                "with a letter or digit"
            )
        if name == BASE:
            raise ConfigError(
                f"{what}: the adapter name {BASE!r} means the base model (a record's adapter {BASE!r}, the "
                "base arm of fan_out adapters_and_base): give the adapter another name"
            )
        if not isinstance(path, str) or not path.strip():
            raise ConfigError(f"{what}.{name}: give the adapter's directory on the workers, got {path!r}")
        if "://" in path and not path.startswith("file://"):
            raise ConfigError(
                f"{what}.{name}: {path!r} is not a directory on the workers: the engines load an adapter "
                "(adapter_config.json and its weights) from local disk. Put it there (the image, a "
                "volume such as kubernetes.model_pvc) and name that path"
            )
        local = path.removeprefix("file://")
        if not local.startswith("/"):
            raise ConfigError(
                f"{what}.{name}: {path!r} is relative: name the adapter's directory by its absolute path"
            )
        out[name] = Adapter(name, local)
    return out


def chosen(record: Mapping[str, Any], adapters: Mapping[str, Adapter]) -> Adapter | None:
    """The adapter that answers ``record`` (``None``: the base model): its ``adapter`` field, else an
    OpenAI batch body's ``model`` when it names one of ``adapters`` (any other ``model`` is the
    pool's). An ``adapter`` field :data:`BASE` names the base model. :class:`ValueError` when the
    ``adapter`` field names none of them."""
    name = record.get(ADAPTER_FIELD)
    if name == BASE:
        return None
    if name is None:
        body = record.get("body")
        model = body.get("model") if isinstance(body, Mapping) else None
        return adapters.get(model) if isinstance(model, str) else None
    adapter = adapters.get(name) if isinstance(name, str) else None
    if adapter is None:
        known = ", ".join(sorted(adapters)) or "none"
        raise ValueError(
            f"its adapter {name!r} is not one of the run's adapters ({known}): add it to the adapters "
            "setting, or correct the record's adapter field"
        )
    return adapter


def counted(name: Any) -> str | None:
    """The adapter a row with ``adapter`` field ``name`` is counted under (``None``: none; a record
    naming no adapter of the run: its name is the record's, not the run's)."""
    return name if isinstance(name, str) and NAME.fullmatch(name) else None
