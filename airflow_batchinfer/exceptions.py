"""The one exception tree of the package. Every error is a :class:`BatchInferError`.

Messages name the bad value and the remedy. Classes that also subclass a builtin (``ValueError``,
``RuntimeError``) do so where the documented contract promises that builtin. The demo's development
helpers keep their one error with them (:class:`airflow_batchinfer.dev.airflow.AirflowApiError`).
"""

from __future__ import annotations

import dataclasses
from typing import Any


class BatchInferError(Exception):
    """Root of every error raised by airflow-batchinfer."""


class ConfigError(BatchInferError, ValueError):
    """An argument or setting is invalid; the message names it and the accepted values."""


def check_known_fields(cls: type, data: dict[str, Any], what: str) -> None:
    """Refuse keys of ``data`` that are not fields of the dataclass ``cls``, listing the known ones."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown {what} {unknown}; known: {sorted(known)}")


class ReviewError(ConfigError):
    """A review request or decision is invalid (a bad cursor, an unknown action, a decision that names
    neither ids nor a filter), or a review document cannot be read; the message says what and why."""


class ReviewClosedError(ReviewError):
    """A decision came after its round's gate was answered: the run has applied the round's
    decisions (and sealed their log), so this one would never take effect."""


class ParamsRefused(ConfigError):
    """A DAG run's params go beyond what the deployment allows (:mod:`airflow_batchinfer.spec.limits`);
    nothing was started or written. ``reasons`` lists every refusal."""

    def __init__(self, reasons: list[str]) -> None:
        self.reasons = reasons
        super().__init__("these params are not allowed here: " + "; ".join(reasons))


class PromptError(BatchInferError, ValueError):
    """A record could not be turned into a prompt; the message says why (becomes the row's error)."""


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


class EngineAsleep(BatchInferError, RuntimeError):
    """A batch reached an engine that is asleep (``Engine.sleep``): the worker wakes the engine before
    each batch, so this is a bug of the caller, which the job's error names."""


class RpcError(BatchInferError):
    """A worker RPC failed. Subclasses say how; the message names the worker and the remedy."""


class WorkerUnavailable(RpcError):
    """The worker could not be reached (refused, reset, timed out): it may be gone."""


class WorkerBusy(RpcError):
    """The worker has no free slot (HTTP 429) or is draining (HTTP 503): try another or later."""


class AuthenticationError(RpcError):
    """The worker refused the token (HTTP 401)."""


class ForbiddenError(RpcError):
    """A job's input or output lies outside the worker's allowed storage prefixes (HTTP 403)."""


class BadJobError(RpcError):
    """The worker rejected the job as invalid (HTTP 400); the message says what is wrong."""


class JobConflict(RpcError):
    """A ``job_id`` the worker knows was submitted again with a different input, outputs or params
    (HTTP 409): job ids must identify one job; include the run in them."""


class SleepRefused(RpcError):
    """The worker's engine cannot free its device (HTTP 409 on ``/v1/sleep``): ``reason`` says why
    and what to do instead (keep the pool warm, or release it)."""

    def __init__(self, message: str, reason: str) -> None:
        self.reason = reason
        super().__init__(message)


class JobNotFound(RpcError):
    """The worker does not know this job (HTTP 404): it restarted, or the job ran elsewhere."""


class JobFailed(BatchInferError):
    """A shard job ended failed or cancelled; ``error`` is the worker's reason."""

    def __init__(self, job_id: str, state: str, error: str | None) -> None:
        self.job_id, self.state, self.error = job_id, state, error
        super().__init__(f"job {job_id} {state}: {error}")


class JobTimeout(BatchInferError, TimeoutError):
    """A shard job did not finish in time (it was cancelled on its worker)."""


class OverQuickBudget(BatchInferError):
    """A ``quick`` prompt rendering (inline, on the worker's event loop) went past
    ``prompts.QUICK_LIMITS``: not an error of the record; render it again without ``quick``, in a
    thread (``PromptBuilder.abuild`` does)."""
