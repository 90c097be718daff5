"""Worker settings from the command line, with environment fallbacks for containers."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from airflow_batchinfer.engines import check_no_secrets, secret_options
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges.rules import CallablePolicy
from airflow_batchinfer.worker.security import is_loopback

TOKEN_ENV = "BATCHINFER_WORKER_TOKEN"
TOKEN_FILE_ENV = "BATCHINFER_WORKER_TOKEN_FILE"
ENGINE_SECRETS_FILE_ENV = "BATCHINFER_WORKER_ENGINE_SECRETS_FILE"
DEFAULT_MAX_BODY_BYTES = 1024 * 1024  # a JobSpec is a few KiB: URIs and params, never records


@dataclass
class WorkerConfig:
    engine: str = "simulated"
    model: str | None = None
    engine_options: dict[str, Any] = field(default_factory=dict)
    # the engine's secret options, from --engine-secrets-file (load_engine_secrets); never printed
    engine_secrets: dict[str, Any] = field(default_factory=dict, repr=False)
    concurrency: int = 10
    host: str = "127.0.0.1"
    port: int = 0
    token: str | None = None
    insecure_no_auth: bool = False
    allowed_prefixes: list[str] | None = field(default_factory=list)
    # callable judge targets jobs may import (--allow-callable): none by default
    allowed_callables: list[str] = field(default_factory=list)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # the largest request body read (413 beyond)
    idle_ttl_s: float | None = None
    lease_file: str | None = None  # a local pool's leases: idle only when no run holds one
    drain_timeout_s: float = 300.0
    target_batch_tokens: int = 16_384
    max_batch_size: int = 256
    batch_timeout_s: float = 0.05
    max_concurrent_batches: int | None = None
    announce_file: str | None = None
    storage_options: dict[str, Any] = field(default_factory=dict)

    def callable_policy(self) -> CallablePolicy:
        """The callable judges this worker's jobs may import (ConfigError for a malformed entry)."""
        return CallablePolicy(self.allowed_callables)

    def validate(self) -> None:
        check_no_secrets(self.engine_options, "--engine-arg")
        if self.concurrency < 1:
            raise ConfigError(f"--concurrency must be >= 1, got {self.concurrency}")
        if self.max_body_bytes < 1024:
            raise ConfigError(f"--max-body-bytes must be >= 1024, got {self.max_body_bytes}")
        self.callable_policy()
        if self.insecure_no_auth:
            if not is_loopback(self.host):
                raise ConfigError("--insecure-no-auth is only allowed on a loopback address (127.0.0.0/8)")
        elif not self.token:
            raise ConfigError(
                f"no RPC token: set {TOKEN_ENV} (or {TOKEN_FILE_ENV} / --token-file); only a loopback dev "
                "worker may run with --insecure-no-auth"
            )


def load_token(token_file: str | None) -> str | None:
    path = token_file or os.environ.get(TOKEN_FILE_ENV)
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read().strip() or None
        except OSError as exc:
            raise ConfigError(f"cannot read the token file {path}: {exc}") from exc
    return os.environ.get(TOKEN_ENV) or None


def load_engine_secrets(path: str | None, engine: str) -> dict[str, Any]:
    """The engine's secret options from a JSON object file (``--engine-secrets-file``, else
    ``$BATCHINFER_WORKER_ENGINE_SECRETS_FILE``; none: ``{}``). The file must be the user's alone
    (mode 0600 or stricter): a secret others can read is no secret, so a looser file is refused."""
    path = path or os.environ.get(ENGINE_SECRETS_FILE_ENV) or None
    if path is None:
        return {}
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ConfigError(f"cannot read the engine secrets file {path}: {exc}") from exc
    with os.fdopen(fd, encoding="utf-8") as f:
        mode = os.fstat(f.fileno()).st_mode & 0o777
        if mode & 0o077:
            raise ConfigError(
                f"the engine secrets file {path} has mode {mode:04o}: its group or others may read or "
                f"change it. Remedy: chmod 600 {path}"
            )
        try:
            data = json.load(f)
        except ValueError:
            data = None  # the text is not repeated: it holds secrets
    return _secret_values(data, path, engine)


def _secret_values(data: Any, path: str, engine: str) -> dict[str, Any]:
    """``data`` (a secrets file's JSON) checked: an object whose keys are ``engine``'s secret options."""
    known = secret_options(engine)
    if not isinstance(data, dict):
        raise ConfigError(f"the engine secrets file {path}: expected a JSON object of secret options "
                          f"({', '.join(known) or 'none for this engine'}) to values")  # fmt: skip
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(
            f"the engine secrets file {path}: {unknown} are not secret options of the {engine} engine "
            f"(it has {sorted(known) or 'none'}); other engine options go in --engine-arg"
        )
    return dict(data)


def parse_options(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs; values are JSON when they parse as JSON (numbers, booleans, lists)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"{pair!r}: expected KEY=VALUE")
        try:
            out[key.replace("-", "_")] = json.loads(value)
        except ValueError:
            out[key.replace("-", "_")] = value
    return out
