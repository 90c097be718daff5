"""How a run's documents are stored: their ``schema_version`` (:data:`DOC_VERSION`), the generic JSON
doc reader and writer (:func:`read_doc`, :func:`write_doc`), the base of the typed models
(:class:`DocModel`) and how a stored doc becomes one (:func:`read_model`,
:func:`validated`); the id digest they carry (:class:`Digest`); and ``run.json``, the run's
settings."""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    ValidationError,
    model_serializer,
)

from airflow_batchinfer.exceptions import ConfigError, StorageError
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage.digest import HEX_DIGITS, IdDigest
from airflow_batchinfer.storage.json_doc import encode_json, read_json, write_json
from airflow_batchinfer.storage.location import Location, StorageOptions, resolve

M = TypeVar("M")

DOC_VERSION = 2  # of every run document but the jobs' (their own MANIFEST_VERSION): 2 for 0.1.0
REDO = "delete it to redo that step"  # the remedy for a doc of a step that cannot be read


def read_doc(uri: str, what: str, so: StorageOptions | None = None) -> dict[str, Any] | None:
    return read_json(resolve(uri, so), schema_version=DOC_VERSION, what=what, remedy=REDO)


def write_doc(uri: str, data: dict[str, Any], so: StorageOptions | None = None) -> None:
    write_json(resolve(uri, so), data, schema_version=DOC_VERSION)


class DocModel(BaseModel):
    """A stored document: unknown fields (and versions, :data:`VERSION`) are refused; the fields in
    ``OMIT_NONE`` are left out when ``None``, nested in another document too (one that has no such
    figure, e.g. an in-place round's ``rejected``, has no such key)."""

    model_config = ConfigDict(extra="forbid")
    VERSION: ClassVar[int] = DOC_VERSION
    OMIT_NONE: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _omit_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        return {k: v for k, v in data.items() if v is not None or k not in self.OMIT_NONE}

    def to_json(self) -> dict[str, Any]:
        """The stored form, without ``schema_version`` (written first by :meth:`encode`)."""
        return self.model_dump(mode="json")

    def encode(self) -> bytes:
        return encode_json(self.to_json(), schema_version=self.VERSION)


class Digest(BaseModel):
    """An :class:`~airflow_batchinfer.storage.digest.IdDigest` as documents carry it."""

    model_config = ConfigDict(extra="forbid")
    count: int
    sum: str = Field(pattern=f"^[0-9a-f]{{{HEX_DIGITS}}}$")

    @classmethod
    def of(cls, digest: IdDigest) -> Digest:
        return cls.model_validate(digest.to_dict())

    def digest(self) -> IdDigest:
        return IdDigest.from_dict(self.model_dump())


def validated(adapter: TypeAdapter[M], loc: Location, data: dict[str, Any], what: str, remedy: str) -> M:
    """``data`` (read from ``loc``, its schema_version checked) as the model ``adapter`` validates."""
    data.pop("schema_version", None)
    try:
        return adapter.validate_python(data)
    except ValidationError as exc:
        why = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'document'}: {e['msg']}" for e in exc.errors()[:3])
        raise StorageError(
            f"{loc.uri}: not a {what} this version of airflow-batchinfer reads ({why}); {remedy}"
        ) from exc


def read_model(
    adapter: TypeAdapter[M],
    uri: str,
    what: str,
    so: StorageOptions | None,
    *,
    version: int = DOC_VERSION,
    remedy: str = REDO,
) -> M | None:
    """The document at ``uri`` as ``adapter``'s model, or ``None`` when there is none. Unreadable
    ones (and unknown versions or fields) are errors."""
    loc = resolve(uri, so)
    data = read_json(loc, schema_version=version, what=what, remedy=remedy)
    return None if data is None else validated(adapter, loc, data, what, remedy)


# ------------------------------------------------------------------------------------ run.json
def write_run_config(cfg: RunConfig, storage_options: StorageOptions | None = None) -> None:
    write_doc(RunLayout(cfg.run_root).run_config, cfg.to_dict(), storage_options)


def read_run_config(run_root: str, storage_options: StorageOptions | None = None) -> RunConfig:
    data = read_doc(RunLayout(run_root).run_config, "run settings", storage_options)
    if data is None:
        raise ConfigError(f"{RunLayout(run_root).run_config} is missing: the run's first task writes it")
    data.pop("schema_version", None)
    return RunConfig.from_dict(data)
