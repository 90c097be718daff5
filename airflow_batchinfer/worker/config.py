"""A worker's configuration: its settings (:mod:`airflow_batchinfer.worker.settings`) in one
object, with the RPC token and the engine's secrets read from their files."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from airflow_batchinfer.engines import check_no_secrets, secret_options
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.judges.rules import CallablePolicy
from airflow_batchinfer.worker.security import is_loopback
from airflow_batchinfer.worker.settings import (
    TOKEN_ENV,
    WORKER_SETTINGS,
    worker_default,
    worker_variable,
)

TOKEN_FILE_ENV = worker_variable("token_file")
ENGINE_SECRETS_FILE_ENV = worker_variable("engine_secrets_file")


@dataclass
class WorkerConfig:
    """What one worker process runs with. Each field but ``token``, ``engine_secrets`` and
    ``storage_options`` is the worker setting of its name, with its default (a test checks them
    against ``WORKER_SETTINGS``); :meth:`from_settings` builds one from the flags."""

    engine: str = worker_default("engine")
    model: str | None = worker_default("model")
    model_cache_dir: str | None = worker_default("model_cache_dir")  # pre-staged models (model_cache)
    engine_options: dict[str, Any] = field(default_factory=partial(worker_default, "engine_options"))
    # the engine's secret options, from --engine-secrets-file (load_engine_secrets); never printed
    engine_secrets: dict[str, Any] = field(default_factory=dict, repr=False)
    concurrency: int = worker_default("concurrency")
    host: str = worker_default("host")
    port: int = worker_default("port")
    token: str | None = None
    insecure_no_auth: bool = worker_default("insecure_no_auth")
    # None: every location (--allow-any-prefix)
    allowed_prefixes: list[str] | None = field(default_factory=partial(worker_default, "allowed_prefixes"))
    # callable judge targets jobs may import (--allow-callable): none by default
    allowed_callables: list[str] = field(default_factory=partial(worker_default, "allowed_callables"))
    # LoRA adapter directories jobs may load besides those inside allowed_prefixes (--allow-adapter)
    allowed_adapters: list[str] = field(default_factory=partial(worker_default, "allowed_adapters"))
    max_body_bytes: int = worker_default("max_body_bytes")  # the largest request body read (413 beyond)
    max_image_bytes: int = worker_default("max_image_bytes")  # each image part's caps (engines.images)
    max_image_pixels: int = worker_default("max_image_pixels")
    max_images_per_request: int = worker_default("max_images_per_request")  # each request's image caps
    max_image_bytes_per_request: int = worker_default("max_image_bytes_per_request")
    idle_ttl_s: float | None = worker_default("idle_ttl_s")
    lease_file: str | None = worker_default("lease_file")  # a local pool's leases: idle only when none held
    drain_timeout_s: float = worker_default("drain_timeout_s")
    target_batch_tokens: int = worker_default("target_batch_tokens")
    max_batch_size: int = worker_default("max_batch_size")
    batch_timeout_s: float = worker_default("batch_timeout_s")
    max_concurrent_batches: int | None = worker_default("max_concurrent_batches")
    announce_file: str | None = worker_default("announce_file")
    storage_options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, values: Mapping[str, Any]) -> WorkerConfig:
        """From every worker setting's value (``worker.settings.settings_from_args``): the engine's
        secrets and the token read from their files (or variables); ``allow_any_prefix``: every
        storage location (``allowed_prefixes=None``)."""
        fields = dict(values)
        secrets_file, token_file = fields.pop("engine_secrets_file"), fields.pop("token_file")
        if fields.pop("allow_any_prefix"):
            fields["allowed_prefixes"] = None
        engine_secrets = load_engine_secrets(secrets_file, fields["engine"])
        return cls(**fields, engine_secrets=engine_secrets, token=load_token(token_file))

    def callable_policy(self) -> CallablePolicy:
        """The callable judges this worker's jobs may import (ConfigError for a malformed entry)."""
        return CallablePolicy(self.allowed_callables)

    def validate(self) -> None:
        """Refuse a secret in the engine options, a setting under its minimum, a malformed callable
        allow-list, and a worker without a token (but a loopback one with ``insecure_no_auth``)."""
        check_no_secrets(self.engine_options, "--engine-arg")
        for s in WORKER_SETTINGS:  # the settings' bounds
            value = getattr(self, s.name) if s.config and s.minimum is not None else None
            if value is not None and value < s.minimum:
                raise ConfigError(f"{s.flag} must be >= {s.minimum:g}, got {value}")
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
        raise ConfigError(
            f"the engine secrets file {path}: expected a JSON object of secret options "
            f"({', '.join(known) or 'none for this engine'}) to values"
        )
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(
            f"the engine secrets file {path}: {unknown} are not secret options of the {engine} engine "
            f"(it has {sorted(known) or 'none'}); other engine options go in --engine-arg"
        )
    return dict(data)
