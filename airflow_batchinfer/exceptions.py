"""The one exception tree of the package. Every error is a :class:`BatchInferError`.

Messages name the bad value and the remedy. Classes that also subclass a builtin (``ValueError``,
``RuntimeError``) do so where the documented contract promises that builtin.
"""

from __future__ import annotations


class BatchInferError(Exception):
    """Root of every error raised by airflow-batchinfer."""


class ConfigError(BatchInferError, ValueError):
    """An argument or setting is invalid; the message names it and the accepted values."""


class StorageError(BatchInferError):
    """Reading or writing a storage location failed."""


class CorruptFileError(StorageError):
    """A file's bytes are damaged (a truncated or invalid zstd stream): a re-read will not help."""


class OutputExistsError(StorageError):
    """The destination already holds data this call did not write; nothing was changed."""


class MalformedRecordError(BatchInferError, ValueError):
    """One input line is not a usable record (raised under ``on_error="raise"``).

    :param source: the file the line came from.
    :param line_no: 1-based line number in ``source``.
    :param reason: what is wrong with the line.
    """

    def __init__(self, source: str, line_no: int, reason: str) -> None:
        self.source = source
        self.line_no = line_no
        self.reason = reason
        super().__init__(
            f"{source}, line {line_no}: {reason}. Fix the line, or pass on_error='quarantine' to move "
            "bad lines to rejects/ (or 'skip' to count and drop them)."
        )


class BatcherError(BatchInferError, RuntimeError):
    """A batcher was used outside its lifecycle (not started, stopped, or from another event loop)."""
