"""Every setting of a worker process, described once.

:data:`WORKER_SETTINGS` is the one description: each :class:`WorkerSetting` has its type, its
default, its help, its ``batchinfer worker serve`` flag and its environment variable
(``BATCHINFER_WORKER_<FLAG>``: containers set these instead of flags). Generated from it:

- the ``batchinfer worker serve`` flags, their defaults, help and environment fallbacks
  (:func:`add_worker_arguments`, :func:`settings_from_args`);
- ``WorkerConfig``'s defaults (``worker/config.py``; a test checks its fields against the spec);
- a local pool's worker command line (:func:`worker_argv`) and a Kubernetes pool's container
  environment (:func:`worker_env`);
- the worker settings table of the docs (:func:`reference_table`).

One default per setting: the DAG params (``settings.py``), ``batchinfer pool up`` and ``run``, the
pool specs and ``PoolSetupOperator`` take theirs from here (:func:`worker_default`); the few that
differ on purpose say why where they do.

No setting is a secret: every value may be in argv and in a Deployment, which others can read. The
RPC token and the engine's secret options reach a worker in files (``token_file``,
``engine_secrets_file``) or, the token, in ``$BATCHINFER_WORKER_TOKEN`` (:data:`TOKEN_ENV`).

This module imports nothing heavy (no Airflow, no engine library): the CLI parser is built from it.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from airflow_batchinfer.engines import ENGINES
from airflow_batchinfer.engines.images import (
    DEFAULT_MAX_IMAGE_BYTES,
    DEFAULT_MAX_IMAGE_BYTES_PER_REQUEST,
    DEFAULT_MAX_IMAGE_PIXELS,
    DEFAULT_MAX_IMAGES_PER_REQUEST,
)
from airflow_batchinfer.exceptions import ConfigError
from airflow_batchinfer.fields import Described
from airflow_batchinfer.judges.rules import ALLOW_CALLABLE_FLAG

ENV_PREFIX = "BATCHINFER_WORKER_"
# The RPC token itself: a secret, so a variable (or the file of token_file), never a flag.
TOKEN_ENV = ENV_PREFIX + "TOKEN"
# How long a pool keeps its workers after its last use (a worker started by hand never idles out):
# the idle_ttl_s of the DAG params, `batchinfer pool up`, the pool specs and PoolSetupOperator.
POOL_IDLE_TTL_S = 600

Kind = Literal["string", "integer", "number", "boolean", "list", "options"]


@dataclass(frozen=True, kw_only=True)
class WorkerSetting(Described):
    """One setting of a worker process (:class:`~airflow_batchinfer.fields.Described`; ``name`` is
    the ``WorkerConfig`` field, unless ``config`` is false, and the parsed flag's ``dest``; ``help``
    the flag's help and the docs' text; ``minimum`` what ``WorkerConfig.validate`` refuses below).

    :ivar type: ``string``, ``integer``, ``number``, ``boolean`` (a switch), ``list`` (a repeatable
        flag; its variable is comma-separated) or ``options`` (a repeatable ``KEY=VALUE`` flag, a
        mapping; values parse as JSON when they can).
    :ivar flag: the ``batchinfer worker serve`` flag.
    :ivar env: its environment variable (``None``: none; it is set only by the flag).
    :ivar config: a ``WorkerConfig`` field of the same name; false: ``WorkerConfig.from_settings``
        reads it into others (``token_file``: ``token``; ``engine_secrets_file``: ``engine_secrets``;
        ``allow_any_prefix``: ``allowed_prefixes=None``).
    :ivar strip: a list whose variable's entries are stripped of spaces (entries never hold any).
    """

    type: Kind
    flag: str
    env: str | None
    config: bool = True
    strip: bool = False

    def __post_init__(self) -> None:
        if self.type == "boolean" and self.default is not False:
            raise ValueError(f"{self.name}: a switch is off by default")
        if self.type == "list" and self.default != ():
            raise ValueError(f"{self.name}: a repeatable flag starts empty: its default is ()")
        if self.env is not None and (self.type == "options" or not self.env.startswith(ENV_PREFIX)):
            raise ValueError(f"{self.name}: a worker's variables are {ENV_PREFIX}*, none of a mapping")

    @property
    def repeatable(self) -> bool:
        return self.type in ("list", "options")

    def copy_default(self) -> Any:
        """The default, a copy (a list for a list setting: what a repeatable flag appends to)."""
        return list(self.default) if self.type == "list" else copy.deepcopy(self.default)

    def usage(self) -> str:
        """What the flag's help adds: repeatable, the default, the variable."""
        parts = ["repeatable"] if self.repeatable else []
        if self.default is not None and not self.repeatable and self.type != "boolean":
            parts.append(f"default {self.default}")
        if self.env:
            parts.append(
                f"env {self.env}" + {"list": ", comma-separated", "boolean": "=1"}.get(self.type, "")
            )
        return "; ".join(parts)

    def text(self, value: Any) -> str:
        """``value`` as this setting's variable holds it."""
        if self.type == "boolean":
            return "1" if value else "0"
        if self.type == "list":
            return ",".join(value)
        return str(value)

    def env_default(self, environ: Mapping[str, str]) -> Any:
        """The flag's default: from its variable when set there, else :meth:`copy_default`. A number
        stays text (argparse reads it with the flag's type, so a bad one is a usage error); an
        empty variable is unset, but a string's (``TOKEN_FILE=""``: no token file)."""
        text = environ.get(self.env) if self.env else None
        if self.type == "options":
            return []  # KEY=VALUE pairs to append to
        if text is None:
            return self.copy_default()
        if self.type == "boolean":
            return text == "1"
        if self.type == "list":
            entries = (x.strip() if self.strip else x for x in text.split(","))
            return [x for x in entries if x]
        if self.type in ("integer", "number") and not text:
            return self.copy_default()
        return text


def _s(
    name: str, type_: Kind, default: Any, help_: str, *, flag: str | None = None, env: bool = True, **kw: Any
) -> WorkerSetting:
    flag = flag or "--" + name.replace("_", "-")
    variable = ENV_PREFIX + flag[2:].upper().replace("-", "_") if env else None
    return WorkerSetting(name=name, type=type_, default=default, help=help_, flag=flag, env=variable, **kw)


# fmt: off
#: Every setting of a worker, in ``batchinfer worker serve --help``'s order.
WORKER_SETTINGS: tuple[WorkerSetting, ...] = (
    _s("engine", "string", "simulated", "the engine; simulated needs no model (benchmarks, orchestration "
       "tests)", choices=ENGINES),
    _s("model", "string", None, "local model directory (or model name for openai)"),
    _s("model_cache_dir", "string", None, "a node-local directory of pre-staged models: the engine "
       "loads <dir>/<the model's directory name> when that holds a complete copy (config.json), else "
       "--model"),
    _s("engine_options", "options", {}, "engine option, e.g. dtype=bfloat16, "
       "max_model_len=4096, base_url=...; values parse as JSON when they can; a secret option (api_key) "
       "is refused",
       flag="--engine-arg", env=False, metavar="KEY=VALUE"),
    _s("concurrency", "integer", 4, "job slots: shard jobs at once, sharing one batcher", minimum=1),
    _s("host", "string", "127.0.0.1", "the address to listen on"),
    _s("port", "integer", 0, "the port to listen on; 0 picks a free one"),
    _s("token_file", "string", None, "file holding the RPC token, else the token itself in "
       f"${TOKEN_ENV}; one is required unless --insecure-no-auth", config=False),
    _s("engine_secrets_file", "string", None, "a JSON object of the engine's secret options (api_key, "
       "default_headers) in a file of mode 0600 (a file its group or others may read is refused); they are "
       "never --engine-arg (argv is readable by every local user)", config=False),
    _s("insecure_no_auth", "boolean", False, "no token (loopback only; development)", env=False),
    _s("allowed_prefixes", "list", (), "storage prefix jobs may read and write; one is required unless "
       "--allow-any-prefix", flag="--allow-prefix"),
    _s("allow_any_prefix", "boolean", False, "allow every storage location (not for shared clusters)",
       config=False),
    _s("allowed_callables", "list", (), "a callable judge jobs may import: 'pkg.mod:function', or every "
       "function of a module 'pkg.mod:' or every module of a package 'pkg.'; none by default: a callable "
       "judge is refused (400)", flag=ALLOW_CALLABLE_FLAG,
       metavar="TARGET", strip=True),
    _s("allowed_adapters", "list", (), "a LoRA adapter directory jobs may load besides those inside the "
       "allowed prefixes (read only): a path, or every adapter under a directory ending in '/'",
       flag="--allow-adapter", metavar="DIR", strip=True),
    _s("max_body_bytes", "integer", 1024 * 1024, "largest request body the worker reads, in bytes (a JobSpec "
       "is a few KiB: URIs and params, never records); larger: 413", minimum=1024),
    _s("max_image_bytes", "integer", DEFAULT_MAX_IMAGE_BYTES, "largest image a request's image part may "
       "hold, in bytes (a data: URL's decoded, a file's read); larger: that record's error", minimum=1),
    _s("max_image_pixels", "integer", DEFAULT_MAX_IMAGE_PIXELS, "most pixels (width x height, read from "
       "its header before decoding) of an image a request's image part holds; more: that record's error",
       minimum=1),
    _s("max_images_per_request", "integer", DEFAULT_MAX_IMAGES_PER_REQUEST, "most image parts one request "
       "may hold (vLLM's limit_mm_per_prompt); more: that record's error, before any is read", minimum=1),
    _s("max_image_bytes_per_request", "integer", DEFAULT_MAX_IMAGE_BYTES_PER_REQUEST, "most bytes a "
       "request's images may hold together (what one record keeps in the worker's memory); more: that "
       "record's error, before the next image is read", minimum=1),
    _s("idle_ttl_s", "number", None, "exit after this many seconds without jobs; unset: never idles out",
       flag="--idle-ttl"),
    _s("lease_file", "string", None, "with --idle-ttl: the local pool's lease file; stay while a run leases "
       "the pool"),
    _s("drain_timeout_s", "number", 300.0, "on SIGTERM, seconds to let running jobs finish before "
       "checkpointing them", flag="--drain-timeout"),
    _s("target_batch_tokens", "integer", 16_384, "tokens per engine batch (prompt estimate + max_tokens)",
       minimum=1),
    _s("max_batch_size", "integer", 256, "requests per engine batch at most"),
    _s("batch_timeout_s", "number", 0.05, "seconds a batch waits to fill after its first request",
       flag="--batch-timeout"),
    _s("max_concurrent_batches", "integer", None, "engine batches in flight; unset: 4 for vllm, else 1",
       env=False),
    _s("announce_file", "string", None, "write {url, pid} here once ready (local pools wait for it)",
       env=False),
)
# fmt: on

BY_NAME: dict[str, WorkerSetting] = {s.name: s for s in WORKER_SETTINGS}


def worker_setting(name: str) -> WorkerSetting:
    """The worker setting called ``name``."""
    return BY_NAME[name]


def worker_default(name: str) -> Any:
    """The one default of the worker setting ``name`` (a copy)."""
    return BY_NAME[name].copy_default()


def worker_variable(name: str) -> str:
    """The environment variable of the worker setting ``name`` (``KeyError``: it has none)."""
    env = BY_NAME[name].env
    if env is None:
        raise KeyError(f"the worker setting {name} has no variable: set it with {BY_NAME[name].flag}")
    return env


# ------------------------------------------------------------------------------ the command line
def add_worker_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str] | None = None) -> None:
    """The ``batchinfer worker serve`` flags; each setting with a variable takes its default from
    ``environ`` (``os.environ``) when set there."""
    environ = os.environ if environ is None else environ
    for s in WORKER_SETTINGS:
        help_ = f"{s.help} ({s.usage()})" if s.usage() else s.help
        kw: dict[str, Any] = {
            "dest": s.name,
            "default": s.env_default(environ),
            "help": help_.replace("%", "%%"),
        }
        if s.type == "boolean":
            kw["action"] = "store_true"
        elif not s.choices:  # the flag's name, not the dest's
            kw["metavar"] = s.metavar or s.flag[2:].upper().replace("-", "_")
        if s.repeatable:
            kw["action"] = "append"
        elif s.type in ("integer", "number"):
            kw["type"] = int if s.type == "integer" else float
        if s.choices:
            kw["choices"] = list(s.choices)
        parser.add_argument(s.flag, **kw)


def settings_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Every setting's value from parsed :func:`add_worker_arguments` flags (``options`` as a mapping)."""
    values = {s.name: getattr(args, s.name) for s in WORKER_SETTINGS}
    for s in WORKER_SETTINGS:
        if s.type == "options":
            values[s.name] = parse_options(values[s.name])
    return values


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


def option_text(key: str, value: Any) -> str:
    """One ``KEY=VALUE`` pair, as :func:`parse_options` reads it back."""
    return f"{key}={value if isinstance(value, str) else json.dumps(value)}"


def worker_argv(values: Mapping[str, Any], *, joined: bool = False) -> list[str]:
    """The ``batchinfer worker serve`` arguments that set ``values`` (setting name → value), in
    their order: ``None`` is left out (the worker's default), a switch is its flag when true, a
    list or mapping one flag per entry. ``joined``: ``--flag=value`` in one argument."""
    out: list[str] = []
    for name, value in values.items():
        s = BY_NAME[name]
        if value is None or (s.type == "boolean" and not value):
            continue
        if s.type == "boolean":
            out.append(s.flag)
            continue
        if s.type == "options":
            texts = [option_text(k, v) for k, v in value.items()]
        else:
            texts = list(value) if s.type == "list" else [str(value)]
        for text in texts:
            out += [f"{s.flag}={text}"] if joined else [s.flag, text]
    return out


def worker_env(values: Mapping[str, Any]) -> dict[str, str]:
    """The variables that set ``values`` (setting name → value), in their order; ``None`` is left
    out (the worker's default). A setting without a variable is refused."""
    out: dict[str, str] = {}
    for name, value in values.items():
        if value is not None:
            out[worker_variable(name)] = BY_NAME[name].text(value)
    return out


# --------------------------------------------------------------------------------------- the docs
def reference_table() -> tuple[list[str], list[list[str]]]:
    """The header and rows of the worker settings table in the docs (cells: text with ````literal````
    spans)."""
    header = ["flag", "environment variable", "default", "meaning"]
    rows = []
    for s in WORKER_SETTINGS:
        flag = f"``{s.flag} {s.metavar}``" if s.metavar and s.type == "options" else f"``{s.flag}``"
        if s.repeatable:
            flag += " (repeatable)"
        env = "—"
        if s.env:
            env = f"``{s.env}=1``" if s.type == "boolean" else f"``{s.env}``"
            env += " (comma-separated)" if s.type == "list" else ""
        if s.type == "boolean":
            default = "off"
        elif s.default is None or s.repeatable:
            default = "none"
        else:
            default = f"``{json.dumps(s.default)}``"
        meaning = _literals(s.help) + (f"; at least {s.minimum:g}" if s.minimum is not None else "")
        rows.append([flag, env, default, meaning])
    return header, rows


def _literals(text: str) -> str:
    """Flags, variables, JSON objects and quoted examples in help text as literals."""
    return re.sub(r"(--[a-z][a-z-]*|\$[A-Z_]+|\{[^{}]*\}|'[^']*')", r"``\1``", text)
