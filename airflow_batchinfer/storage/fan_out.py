"""Round 0's fan-out (the run setting ``fan_out``): every input record once per *arm*, each of the
run's LoRA adapters and, with ``adapters_and_base``, the base model.

An input record with id ``ID`` becomes one record per arm: its fields, its id ``ID@ARM`` (text; a
number id as its digits), ``adapter`` the arm (``base`` for the base model,
:data:`~airflow_batchinfer.engines.adapters.BASE`) and ``input_id`` the input's ``ID``, so rows join
back to their input record. Two input ids never give one row id: ids are unique as text (the reader
rejects ``"1"`` after ``1`` as a repeat: :func:`~airflow_batchinfer.storage.records.id_text`), and
adapter names hold no ``@``, so the arm is the text after a row id's last ``@`` (an ``ID`` may hold
``@`` itself). Review decisions and an in-place job's checkpoints name rows by these ids. The rows are records
like any other: judged, retried with their arm and accounted by their own ids.

Records are fanned out where round 0 reads them, never stored twice: a byte-range shard's reader
(:class:`~airflow_batchinfer.storage.ranges.RangeRecordReader`: its job, the round's close, the
pre-flight and the report read the same rows, and the range's reference names the arms), or the
copy sharding makes of an input it cannot split. What is about the input's lines (its id hash files,
repeated ids, the ``rejects/`` line numbers) stays about lines.

A record that picks its own adapter (its ``adapter`` field, an OpenAI batch body's ``model`` naming
one of the arms) or holds ``input_id`` is a bad line, rejected with the reason
(:meth:`FanOut.refusal`): the fan-out answers it with every arm, so its own choice would be dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_batchinfer.exceptions import ConfigError

ADAPTER_FIELD = "adapter"  # a record's (and an output row's) adapter name
BASE = "base"  # the base model as a record's adapter (a fan-out's base arm): no adapter may be named so

FAN_OUT_MODES = ("off", "adapters", "adapters_and_base")
INPUT_ID = "input_id"  # a fanned-out row's field: its input record's id
SEP = "@"


@dataclass(frozen=True)
class FanOut:
    """The arms every input record runs on, in order (``base`` first when it is one)."""

    arms: tuple[str, ...]

    @classmethod
    def of_mode(cls, mode: str, adapters: Iterable[str]) -> FanOut | None:
        """The fan-out of the ``fan_out`` setting over ``adapters`` (names); ``None`` when off."""
        if mode not in FAN_OUT_MODES:
            raise ConfigError(f"fan_out {mode!r}: choose one of {', '.join(FAN_OUT_MODES)}")
        if mode == "off":
            return None
        names = sorted(adapters)
        if not names:
            raise ConfigError(
                f"fan_out {mode!r} runs every record once per LoRA adapter, but the run names none: set "
                'adapters ({"name": "/path/to/adapter"}), or fan_out off'
            )
        return cls((BASE,) * (mode == "adapters_and_base") + tuple(names))

    @classmethod
    def of(cls, value: Any, what: str = "fan_out") -> FanOut | None:
        """From a range shard's or a job's ``fan_out`` (the arms' names); ``None``: no fan-out."""
        if value is None:
            return None
        ok = isinstance(value, Sequence) and not isinstance(value, str) and value
        if not ok or not all(isinstance(a, str) and a and SEP not in a for a in value):
            raise ConfigError(f"{what} must be a list of arm names without '@', got {value!r}")
        if len(set(value)) != len(value):
            raise ConfigError(f"{what} names an arm twice: {value!r}")
        return cls(tuple(value))

    @property
    def adapters(self) -> tuple[str, ...]:
        """The arms that are adapters (not the base model)."""
        return tuple(a for a in self.arms if a != BASE)

    def as_json(self) -> list[str]:
        return list(self.arms)

    def row_id(self, value: Any, arm: str) -> str:
        """The id of input id ``value``'s row on ``arm``."""
        return f"{value}{SEP}{arm}"

    def ids(self, ids: Iterable[Any]) -> list[str]:
        """The row ids of input ids ``ids``, each id's arms in order."""
        return [self.row_id(value, arm) for value in ids for arm in self.arms]

    def expand(self, records: Iterable[Mapping[str, Any]], id_field: str) -> list[dict[str, Any]]:
        """Each record's rows, one per arm, in order."""
        out = []
        for record in records:
            value = record[id_field]
            for arm in self.arms:
                out.append({**record, id_field: self.row_id(value, arm), INPUT_ID: value, ADAPTER_FIELD: arm})
        return out

    def refusal(self, record: Mapping[str, Any]) -> str | None:
        """Why ``record`` cannot be fanned out (``None``: it can): it picks its own adapter, or it holds
        the field the fan-out writes its id to."""
        remedy = "remove it, or run with fan_out off"
        own = record.get(ADAPTER_FIELD)
        if own is not None:
            return (
                f"its adapter field {own!r} picks one adapter, but fan_out runs every record on each of "
                f"{', '.join(self.arms)}: {remedy}"
            )
        body = record.get("body")
        model = body.get("model") if isinstance(body, Mapping) else None
        if isinstance(model, str) and model in self.adapters:
            return (
                f"its body's model {model!r} picks that adapter, but fan_out runs every record on each of "
                f"{', '.join(self.arms)}: {remedy}"
            )
        if INPUT_ID in record:
            return (
                f"it has a field {INPUT_ID!r}, where fan_out writes the record's id on each of its rows: "
                "rename that field, or run with fan_out off"
            )
        return None
